// WindowPermutation: a seeded pseudo-random permutation of [0, n) that needs no table, for
// visiting a dataset's windows in shuffled order (training.shuffle) with a loader state of a few
// integers: window q of epoch e is permutation(seed, e)(q), computed on demand.
//
// How: a 4-round Feistel network on the smallest domain of 2h bits (h >= 1) that holds n — a
// bijection of [0, 4^h) whatever the round function — with each round's function a splitmix64
// hash of (key, round, half), the key drawn from (seed, epoch); values >= n are mapped again
// (cycle-walking), which keeps a bijection on [0, n). 4^h < 4 n, so a value takes fewer than 4
// rounds of walking on average. O(1) memory, O(1) expected time per index.
//
//   WindowPermutation p(n, seed, epoch);
//   uint64_t w = p(q);   // q in [0, n): every w in [0, n) exactly once over q
//
// Test: tests/data/test_window_permutation.cpp
#pragma once

#include <cstdint>

namespace moepeak {

class WindowPermutation {
 public:
  // n >= 1 (moepeak::Error otherwise).
  WindowPermutation(uint64_t n, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return n_; }
  // The image of q (q < n; moepeak::Error otherwise).
  uint64_t operator()(uint64_t q) const;

 private:
  uint64_t encrypt(uint64_t x) const;  // one pass of the network on [0, 4^h)
  uint64_t n_;
  int half_bits_;       // h
  uint64_t half_mask_;  // 2^h - 1
  uint64_t key_;
};

}  // namespace moepeak
