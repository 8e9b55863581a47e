// WindowPermutation: see window_permutation.h.
#include "core/data/window_permutation.h"

#include "core/error.h"

namespace moepeak {
namespace {

constexpr int kRounds = 4;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

WindowPermutation::WindowPermutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  MOEPEAK_CHECK(n >= 1, "WindowPermutation: an empty range");
  half_bits_ = 1;
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  key_ = splitmix64(splitmix64(seed) ^ splitmix64(epoch + 0x51ed270b2ULL));
}

uint64_t WindowPermutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = splitmix64(key_ ^ (static_cast<uint64_t>(r) << 56) ^ right) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t WindowPermutation::operator()(uint64_t q) const {
  MOEPEAK_CHECK(q < n_, "WindowPermutation: index ", q, " outside [0, ", n_, ")");
  // NOTES: cycle-walking: the network permutes [0, 4^h) and 4^h >= n, so following the cycle of
  // q until it re-enters [0, n) gives a permutation of [0, n) (each cycle of the network visits
  // the values below n in turn).
  uint64_t x = encrypt(q);
  while (x >= n_) x = encrypt(x);
  return x;
}

}  // namespace moepeak
