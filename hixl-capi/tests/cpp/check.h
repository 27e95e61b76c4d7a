// What the C++ test programs written against CANN's headers share (adxl_engine.cpp,
// cann_abi.cpp): a failure count, status and condition checks that report their line, and the
// FNV-1a sum the tests compare across processes (tests/common/mod.rs reads it). hixl_style.cpp
// keeps its own, as written before hixl's header changed: it shows that header unchanged in use.
#ifndef HIXL_TEST_CHECK_H_
#define HIXL_TEST_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <iostream>

namespace {
int failures = 0;

void Expect(uint32_t got, uint32_t want, int line) {
  if (got != want) {
    std::cerr << "line " << line << ": status " << got << ", expected " << want << "\n";
    failures++;
  }
}

uint64_t Fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
}  // namespace

#define EXPECT(call, want) Expect((call), (want), __LINE__)
#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::cerr << "line " << __LINE__ << ": " #cond " is false\n"; \
      failures++;                                                   \
    }                                                               \
  } while (0)

#endif  // HIXL_TEST_CHECK_H_
