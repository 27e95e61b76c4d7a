/* The backend's parameters: NIXL's custom parameters, then the environment, then defaults. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "engine.h"

namespace hixl_nixl {

namespace {

/* The IPv4 address of the interface the default route leaves by (a UDP socket's connect
 * picks it; nothing is sent), else loopback. */
std::string default_ip() {
  std::string ip = "127.0.0.1";
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ip;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  ::inet_pton(AF_INET, "192.0.2.1", &to.sin_addr);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  char buf[INET_ADDRSTRLEN];
  if (::connect(s, reinterpret_cast<sockaddr *>(&to), sizeof to) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr *>(&me), &len) == 0 &&
      me.sin_addr.s_addr != htonl(INADDR_ANY) &&
      ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf) != nullptr) {
    ip = buf;
  }
  ::close(s);
  return ip;
}

std::optional<int32_t> positive(const std::string &v) {
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || n <= 0 || n > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(n);
}

/* the keys of HIXL's own options hixl_initialize takes besides "hixl.*" ones (AutoConnect is
 * the backend's: always on) */
bool hixl_key(const std::string &k) {
  static const char *keys[] = {"BufferPool", "RdmaTrafficClass", "RdmaServiceLevel",
                               "GlobalResourceConfig", "LocalCommRes"};
  if (k.rfind("hixl.", 0) == 0) return true;
  for (const char *h : keys)
    if (k == h) return true;
  return false;
}

}  // namespace

nixl_b_params_t default_params() {
  return {{"ip", ""},
          {"deadline_ms", "60000"},
          {"connect_timeout_ms", "5000"},
          {"notify_timeout_ms", "5000"},
          {"poll_wait_ms", "1"},
          {"lanes", "2"}};
}

std::optional<Settings> Settings::from(const nixl_b_params_t &params, std::string &why) {
  Settings s;
  bool deadline_given = false;
  for (const auto &[k, v] : params) {
    if (k == "ip") {
      s.ip = v;
    } else if (k == "poll_wait_ms") {
      auto n = v == "0" ? std::optional<int32_t>(0) : positive(v);
      if (!n || *n > 1000) {
        why = "parameter poll_wait_ms=\"" + v + "\": 0 to 1000 milliseconds";
        return std::nullopt;
      }
      s.poll_wait_ms = *n;
    } else if (k == "lanes") {
      auto n = positive(v);
      if (!n || *n > 16) {
        why = "parameter lanes=\"" + v + "\": 1 to 16";
        return std::nullopt;
      }
      s.lanes = *n;
    } else if (k == "deadline_ms" || k == "connect_timeout_ms" || k == "notify_timeout_ms") {
      auto n = positive(v);
      if (!n) {
        why = "parameter " + k + "=\"" + v + "\": a positive number of milliseconds is needed";
        return std::nullopt;
      }
      if (k == "deadline_ms") {
        s.deadline_ms = *n;
        deadline_given = true;
      } else if (k == "connect_timeout_ms") {
        s.connect_timeout_ms = *n;
      } else {
        s.notify_timeout_ms = *n;
      }
    } else if (hixl_key(k)) {
      s.hixl_options.emplace_back(k, v);
    } else {
      why = "unknown parameter \"" + k +
            "\" (known: ip, deadline_ms, connect_timeout_ms, notify_timeout_ms, poll_wait_ms, lanes, "
            "and hixl's "
            "options: hixl.*, BufferPool, RdmaTrafficClass, RdmaServiceLevel, "
            "GlobalResourceConfig, LocalCommRes)";
      return std::nullopt;
    }
  }
  if (s.ip.empty()) {
    const char *env = std::getenv("HIXL_NIXL_IP");
    s.ip = env && *env ? env : default_ip();
  }
  if (!deadline_given) {
    if (const char *env = std::getenv("HIXL_NIXL_DEADLINE_MS"); env && *env) {
      auto n = positive(env);
      if (!n) {
        why = std::string("HIXL_NIXL_DEADLINE_MS=\"") + env +
              "\": a positive number of milliseconds is needed";
        return std::nullopt;
      }
      s.deadline_ms = *n;
    }
  }
  return s;
}

}  // namespace hixl_nixl
