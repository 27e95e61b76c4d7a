/*
 * Parts of the plugin alone, without NIXL or a second engine: the reassembly of NIXL
 * notifications from hixl notifies (notif.cc: its bound holds for senders of empty parts too, and
 * a restarted sender's blob is not lost) and the cutting of a batch into parts (engine.cc,
 * split: byte counts past 2^64). Run by hixl-capi/tests/nixl_plugin.rs (cargo test); prints
 * "ok".
 */
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"
#include "expect.h"
#include "notif.h"

using hixl_nixl::Reassembly;

int main() {
  std::vector<std::pair<std::string, std::string>> done;

  /* a sender of first parts with nothing in them: the records count against the bound (before,
   * 100000 of them stayed, charged 0 bytes) */
  {
    const size_t bound = 1u << 20;
    Reassembly r(bound);
    for (int i = 1; i <= 100000; i++) {
      EXPECT(r.add("nixl:x", std::to_string(i) + ":0:2:", done), true);
    }
    EXPECT(r.pending_bytes() <= bound, true);
    EXPECT(r.pending_blobs() <= bound / hixl_nixl::kBlobOverhead, true);
    EXPECT(r.pending_blobs() > 0, true);
    EXPECT(r.dropped(), 100000 - r.pending_blobs());
    EXPECT(done.size(), 0);
  }

  /* a sender that restarted mid-blob numbers from 1 again: its new blob 1 arrives whole (before,
   * its part 0 dropped the older blob and forgot it, and parts 1 on were not NIXL's) */
  {
    Reassembly r(1u << 20);
    auto a = hixl_nixl::encode_blob("s", 1, std::string(2000, 'a'));
    auto b = hixl_nixl::encode_blob("s", 1, std::string(1500, 'b'));
    EXPECT(a.size(), 3);
    EXPECT(b.size(), 3);
    EXPECT(r.add(a[0].name, a[0].msg, done), true);
    EXPECT(r.add(a[1].name, a[1].msg, done), true);
    for (const auto &p : b) EXPECT(r.add(p.name, p.msg, done), true);
    EXPECT(done.size(), 1);
    EXPECT(done.size() == 1 && done[0].first == "s" && done[0].second == std::string(1500, 'b'),
           true);
    EXPECT(r.dropped(), 1);
    EXPECT(r.pending_blobs(), 0);
    EXPECT(r.pending_bytes(), 0);
    done.clear();
  }

  /* interleaved senders complete in any order; what completes is charged no more */
  {
    Reassembly r(1u << 20);
    auto x = hixl_nixl::encode_blob("x", 7, std::string(1000, 'x'));
    auto y = hixl_nixl::encode_blob("y", 7, std::string(1000, 'y'));
    EXPECT(r.add(x[0].name, x[0].msg, done), true);
    EXPECT(r.add(y[0].name, y[0].msg, done), true);
    EXPECT(r.pending_blobs(), 2);
    EXPECT(r.add(y[1].name, y[1].msg, done), true);
    EXPECT(r.add(x[1].name, x[1].msg, done), true);
    EXPECT(done.size() == 2 && done[0].second == std::string(1000, 'y') &&
               done[1].second == std::string(1000, 'x'),
           true);
    EXPECT(r.pending_blobs(), 0);
    EXPECT(r.pending_bytes(), 0);
    EXPECT(r.dropped(), 0);
  }

  /* a batch whose lengths add up past 2^64 (two of 2^63 bytes, then 16 MiB) on two lanes: every
   * byte in exactly one part, in order (before, the sum wrapped, the first part ended at byte
   * 8 MiB, and the cut wrote past the parts' vector) */
  {
    const uint64_t half = uint64_t{1} << 63, tail = 16u << 20;
    std::vector<hixl_transfer_op_desc> descs = {
        {0x1000, 0x9000, half}, {0x2000, 0xa000, half}, {0x3000, 0xb000, tail}};
    auto parts = hixl_nixl::split(descs, 2, 1u << 20);
    EXPECT(parts.size(), 2);
    std::vector<hixl_transfer_op_desc> joined;
    for (const auto &p : parts) {
      EXPECT(p.descs.empty(), false);
      for (const auto &d : p.descs) {
        if (!joined.empty() && joined.back().local_addr + joined.back().len == d.local_addr &&
            joined.back().remote_addr + joined.back().len == d.remote_addr) {
          joined.back().len += d.len; /* a descriptor cut at a part's end, joined again */
        } else {
          joined.push_back(d);
        }
      }
    }
    EXPECT(joined.size(), 3);
    for (size_t i = 0; i < joined.size() && i < descs.size(); i++) {
      EXPECT(joined[i].local_addr, descs[i].local_addr);
      EXPECT(joined[i].remote_addr, descs[i].remote_addr);
      EXPECT(joined[i].len, descs[i].len);
    }
  }

  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
