#include "notif.h"

#include <algorithm>
#include <charconv>
#include <string_view>

namespace hixl_nixl {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* the unsigned decimal at the start of `s`, and the rest after the ':' that ends it */
std::optional<uint64_t> field(std::string_view &s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data() || end == s.data() + s.size() || *end != ':') {
    return std::nullopt;
  }
  s.remove_prefix(static_cast<size_t>(end - s.data()) + 1);
  return v;
}

}  // namespace

std::string base64_encode(const char *data, size_t len) {
  std::string out;
  out.reserve((len + 2) / 3 * 4);
  const auto *p = reinterpret_cast<const unsigned char *>(data);
  size_t i = 0;
  for (; i + 3 <= len; i += 3) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < len) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (i + 1 < len) v |= uint32_t{p[i + 1]} << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < len ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(const std::string &text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int s[4];
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      char c = text[i + k];
      if (c == '=' && last && k >= 2) {
        s[k] = 0;
        pad++;
        continue;
      }
      if (pad > 0) return std::nullopt; /* data after padding */
      s[k] = sextet(c);
      if (s[k] < 0) return std::nullopt;
    }
    uint32_t v = (uint32_t(s[0]) << 18) | (uint32_t(s[1]) << 12) | (uint32_t(s[2]) << 6) |
                 uint32_t(s[3]);
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

std::vector<Part> encode_blob(const std::string &agent, uint64_t id, const std::string &blob) {
  std::vector<Part> parts;
  std::string name = std::string(kNamePrefix) + agent;
  if (name.size() > kNotifyMax) return parts;
  const uint64_t count = blob.empty() ? 1 : (blob.size() + kPartBytes - 1) / kPartBytes;
  parts.reserve(count);
  for (uint64_t k = 0; k < count; k++) {
    size_t off = k * kPartBytes;
    size_t n = std::min(kPartBytes, blob.size() - std::min(off, blob.size()));
    std::string msg = std::to_string(id) + ':' + std::to_string(k) + ':' + std::to_string(count) +
                      ':' + base64_encode(blob.data() + std::min(off, blob.size()), n);
    parts.push_back({name, std::move(msg)});
  }
  return parts;
}

void Reassembly::erase(std::map<Key, Blob>::iterator it) {
  bytes_ -= charge(it->first, it->second);
  order_.erase(it->second.age);
  blobs_.erase(it);
}

bool Reassembly::add(const std::string &name, const std::string &msg,
                     std::vector<std::pair<std::string, std::string>> &done) {
  const std::string prefix = kNamePrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::string agent = name.substr(prefix.size());
  std::string_view rest = msg;
  auto id = field(rest);
  if (!id) return false;
  auto part = field(rest);
  if (!part) return false;
  auto parts = field(rest);
  if (!parts || *parts == 0 || *part >= *parts) return false;
  auto bytes = base64_decode(std::string(rest));
  if (!bytes) return false;
  if (*parts == 1) {
    done.emplace_back(std::move(agent), std::move(*bytes));
    return true;
  }
  Key key{agent, *id};
  auto it = blobs_.find(key);
  if (it != blobs_.end() && *part == 0) {
    /* a new blob under an id in progress: its sender restarted (or broke off mid-blob and
     * numbered on); the older blob is lost, this one starts */
    dropped_++;
    erase(it);
    it = blobs_.end();
  }
  if (it == blobs_.end()) {
    if (*part != 0) return false; /* its start was dropped */
    it = blobs_.emplace(key, Blob{*parts, 0, std::string(), {}}).first;
    it->second.age = order_.insert(order_.end(), key);
    bytes_ += charge(it->first, it->second);
  }
  Blob &b = it->second;
  if (b.parts != *parts || b.next != *part) {
    /* out of order on one link cannot happen: a sender that broke off mid-blob and reused
     * its id; the blob is lost */
    dropped_++;
    erase(it);
    return false;
  }
  b.data += *bytes;
  bytes_ += bytes->size();
  b.next++;
  if (b.next == b.parts) {
    bytes_ -= charge(it->first, b);
    order_.erase(b.age);
    done.emplace_back(std::move(agent), std::move(b.data));
    blobs_.erase(it);
    return true;
  }
  while (bytes_ > max_bytes_ && !order_.empty()) {
    dropped_++;
    erase(blobs_.find(order_.front()));
  }
  return true;
}

}  // namespace hixl_nixl
