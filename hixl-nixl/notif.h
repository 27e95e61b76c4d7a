/*
 * NIXL notifications on hixl's notify path. A NIXL notification is a blob of any size (NULs
 * included) from one agent to another; a hixl notify is a name and a UTF-8 message of at most
 * 1024 bytes each. So a blob travels as one or more notifies:
 *
 *   name:    "nixl:" + the sending agent's name
 *   message: "<id>:<part>:<parts>:" + base64 of up to kPartBytes bytes of the blob
 *
 * where <id> numbers the sender's blobs (one counter per engine), and the parts of one blob
 * are sent in order on one link (hixl delivers a link's notifies in order). The receiver puts
 * a blob together from its parts, per (sender, id), and hands it to NIXL once complete.
 */
#ifndef HIXL_NIXL_NOTIF_H_
#define HIXL_NIXL_NOTIF_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hixl_nixl {

/* hixl's bound on a notify's name and message (include/hixl_c.h, MAX_NOTIFY_LEN) */
constexpr size_t kNotifyMax = 1024;
/* blob bytes per part: 960 characters of base64, plus a header of at most 62 */
constexpr size_t kPartBytes = 720;
/* the prefix of a notify name that carries a NIXL notification */
constexpr const char *kNamePrefix = "nixl:";

std::string base64_encode(const char *data, size_t len);
/* std::nullopt for text that is not base64 (length, alphabet, padding) */
std::optional<std::string> base64_decode(const std::string &text);

struct Part {
  std::string name;
  std::string msg;
};

/* The notifies that carry `blob` from `agent` as blob number `id`; empty when `agent` is too
 * long for a notify name. */
std::vector<Part> encode_blob(const std::string &agent, uint64_t id, const std::string &blob);

/* What an incomplete blob is charged beyond its bytes (its record, its sender's name is added):
 * so a sender of empty parts cannot make the records grow past the bound either. */
constexpr size_t kBlobOverhead = 256;

/* Puts blobs together from the parts received. Holds at most `max_bytes` of incomplete blobs,
 * each charged its bytes, its sender's name and kBlobOverhead: past that the oldest incomplete
 * one is dropped (and counted). A part 0 for a (sender, id) already in progress starts the blob
 * again (a sender that restarted numbers its blobs from 1 again; the older blob is dropped). */
class Reassembly {
 public:
  explicit Reassembly(size_t max_bytes) : max_bytes_(max_bytes) {}

  /* One received notify; a complete blob is appended to `done` as (agent, blob). Returns false
   * for a notify that is not a NIXL notification part (it is ignored). */
  bool add(const std::string &name, const std::string &msg,
           std::vector<std::pair<std::string, std::string>> &done);

  size_t dropped() const { return dropped_; }
  /* what the incomplete blobs are charged (their bytes, names and records) */
  size_t pending_bytes() const { return bytes_; }
  size_t pending_blobs() const { return blobs_.size(); }

 private:
  using Key = std::pair<std::string, uint64_t>;
  struct Blob {
    uint64_t parts;
    uint64_t next = 0;
    std::string data;
    std::list<Key>::iterator age; /* its place in order_ */
  };
  std::map<Key, Blob> blobs_;
  std::list<Key> order_; /* incomplete blobs, oldest first */
  size_t max_bytes_;
  size_t bytes_ = 0;
  size_t dropped_ = 0;

  static size_t charge(const Key &k, const Blob &b) {
    return kBlobOverhead + k.first.size() + b.data.size();
  }
  /* removes the blob at `it` (its charge, its place in order_) */
  void erase(std::map<Key, Blob>::iterator it);
};

}  // namespace hixl_nixl

#endif /* HIXL_NIXL_NOTIF_H_ */
