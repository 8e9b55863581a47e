// WindowPermutation (core/data/window_permutation.h): a bijection of [0, n) for every n (the
// Feistel domain's edge cases: 1, 2, 3, 4, 5, powers of 4 and their neighbours, a prime), the
// same for the same (seed, epoch), a different order for another epoch or seed, and an order that
// looks shuffled (few fixed points, no long run of consecutive windows).
// Run: ctest -R test_window_permutation
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/data/window_permutation.h"
#include "core/error.h"

namespace moepeak {
namespace {

std::vector<uint64_t> order(uint64_t n, uint64_t seed, uint64_t epoch) {
  const WindowPermutation p(n, seed, epoch);
  std::vector<uint64_t> out;
  for (uint64_t q = 0; q < n; ++q) out.push_back(p(q));
  return out;
}

TEST(WindowPermutation, IsABijectionForEverySize) {
  for (uint64_t n : {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4096, 65537}) {
    for (uint64_t epoch : {0, 1, 7}) {
      std::vector<int> seen(n, 0);
      for (uint64_t w : order(n, 1234, epoch)) {
        ASSERT_LT(w, n);
        ++seen[w];
      }
      for (uint64_t w = 0; w < n; ++w) ASSERT_EQ(seen[w], 1) << "n " << n << ", window " << w;
    }
  }
}

TEST(WindowPermutation, DeterministicPerSeedAndEpochAndDifferentAcrossThem) {
  const uint64_t n = 1000;
  EXPECT_EQ(order(n, 1234, 3), order(n, 1234, 3));
  EXPECT_NE(order(n, 1234, 3), order(n, 1234, 4));
  EXPECT_NE(order(n, 1234, 3), order(n, 1235, 3));
}

TEST(WindowPermutation, LooksShuffled) {
  const uint64_t n = 10000;
  const std::vector<uint64_t> o = order(n, 99, 0);
  int fixed = 0, consecutive = 0;
  for (uint64_t q = 0; q < n; ++q) {
    fixed += o[q] == q;
    if (q > 0) consecutive += o[q] == o[q - 1] + 1;
  }
  // A uniform permutation has about 1 fixed point and 1 ascent by one, in expectation.
  EXPECT_LE(fixed, 10);
  EXPECT_LE(consecutive, 10);
  // The first tenth of the epoch spreads over the whole range, not one end of it.
  uint64_t low = 0;
  for (uint64_t q = 0; q < n / 10; ++q) low += o[q] < n / 2;
  EXPECT_GT(low, n / 10 * 4 / 10);
  EXPECT_LT(low, n / 10 * 6 / 10);
}

TEST(WindowPermutation, Errors) {
  EXPECT_THROW(WindowPermutation(0, 1, 0), Error);
  const WindowPermutation p(5, 1, 0);
  EXPECT_THROW(p(5), Error);
}

}  // namespace
}  // namespace moepeak
