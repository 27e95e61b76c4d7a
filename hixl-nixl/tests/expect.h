/*
 * What hixl-nixl's test programs share (harness.cc, units.cc): a failure count, and checks that
 * report the file, the line and the expression of a difference, and count it.
 */
#ifndef HIXL_NIXL_TESTS_EXPECT_H_
#define HIXL_NIXL_TESTS_EXPECT_H_

#include <cstdio>

namespace {

int failures = 0;

/* a difference is reported with its place and the expression, and counted */
void expect(long long got, long long want, const char *what, const char *file, int line) {
  if (got != want) {
    std::fprintf(stderr, "%s:%d: %s is %lld, expected %lld\n", file, line, what, got, want);
    failures++;
  }
}

}  // namespace

#define EXPECT(got, want) \
  expect(static_cast<long long>(got), static_cast<long long>(want), #got, __FILE__, __LINE__)
#define CHECK(cond) expect((cond) ? 1 : 0, 1, #cond, __FILE__, __LINE__)

#endif /* HIXL_NIXL_TESTS_EXPECT_H_ */
