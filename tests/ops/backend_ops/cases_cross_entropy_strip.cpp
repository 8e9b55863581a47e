// test_backend_ops cases: the cross-entropy strip fold of Ring-DTP (ops/cross_entropy_strip.h):
// state init, strip forward, state merge, strip backward, and the whole fold of three strips.
//
// The state (N, 3) is f64 in both runs (Kind::f64); the harness counts -inf == -inf as agreement,
// so identity states (-inf, 0, 0) that stay so (ignored tokens) compare. Input states mix the
// identity (about one row in four) with folded ones, m in [-3, 3) or, for a strip far below the
// running max, in [30, 40). Labels mix -100, ids inside the strip's columns
// [column_begin, column_begin + C) and ids outside it, with column_begin 0 and > 0. Strips are
// normal or uniform in [-30, 30). The backward takes a finished state (no identity rows: their
// lse is -inf) and also runs in place (dstrip = strip, passed twice as one inout tensor).
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cross_entropy.h"
#include "ops/cross_entropy_strip.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// Per token [m, z, t]: the identity (-inf, 0, 0) with probability `identity`, else m uniform in
// [m_lo, m_hi), z in [0.5, 4), t normal.
Generator states(double identity, double m_lo, double m_hi) {
  return [identity, m_lo, m_hi](std::mt19937_64& rng, int64_t n) {
    std::bernoulli_distribution empty(identity);
    std::uniform_real_distribution<double> m(m_lo, m_hi), z(0.5, 4.0);
    std::normal_distribution<double> t(0.0, 1.0);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t row = 0; 3 * row < n; ++row) {
      if (empty(rng)) {
        v[3 * row] = kMinusInf;
        v[3 * row + 1] = 0;
        v[3 * row + 2] = 0;
      } else {
        v[3 * row] = m(rng);
        v[3 * row + 1] = z(rng);
        v[3 * row + 2] = t(rng);
      }
    }
    return v;
  };
}

// Labels: -100 with probability 1/4, else half inside [begin, begin + columns), half anywhere
// in [0, vocab).
Generator strip_labels(int64_t begin, int64_t columns, int64_t vocab) {
  return [begin, columns, vocab](std::mt19937_64& rng, int64_t n) {
    std::uniform_int_distribution<int> kind(0, 3);
    std::uniform_int_distribution<int64_t> inside(begin, begin + columns - 1), any(0, vocab - 1);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      int k = kind(rng);
      x = k == 0 ? double(ops::kIgnoreLabel) : k == 1 ? double(inside(rng)) : double(any(rng));
    }
    return v;
  };
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(cross_entropy_strip) {
  std::vector<OpCase> cases;
  for (int64_t n : {37, 1, 0}) {
    cases.push_back(OpCase{
        "cross_entropy_state_init N=" + std::to_string(n),
        {out("state", {n, 3}, Kind::f64)},
        [](const std::vector<Tensor>& t, Stream& s) { ops::cross_entropy_state_init(t[0], s); }});
  }

  struct StripShape {
    std::string name;
    int64_t n, c, begin;
    Generator strip;
    double m_lo = -3, m_hi = 3;
  };
  const std::vector<StripShape> shapes{
      {"", 37, 100, 0, normal(3.0)},
      {"", 8, 5000, 0, normal(2.0)},
      {"", 300, 20, 40, normal()},
      {"", 5, 1, 3, normal()},
      {"", 0, 10, 0, normal()},
      {" large", 16, 777, 2000, uniform(-30, 30)},
      {" large", 3, 4097, 4097, uniform(-30, 30)},
      {" below the running max", 24, 300, 600, normal(), 30, 40},
  };
  for (const auto& sh : shapes) {
    const int64_t n = sh.n, c = sh.c, begin = sh.begin, vocab = begin + c + 50;
    std::string shape = sh.name + " N=" + std::to_string(n) + " C=" + std::to_string(c) +
                        " begin=" + std::to_string(begin);
    cases.push_back(OpCase{"cross_entropy_strip_forward" + shape,
                           {in("strip", {n, c}, Kind::floating, sh.strip),
                            in("labels", {n}, Kind::i64, strip_labels(begin, c, vocab)),
                            inout("state", {n, 3}, Kind::f64, states(0.25, sh.m_lo, sh.m_hi))},
                           [begin](const std::vector<Tensor>& t, Stream& s) {
                             ops::cross_entropy_strip_forward(t[0], t[1], begin, t[2], s);
                           }});
    // A finished state: lse = m + log z in [3, 5.4), above most logits of a normal strip.
    cases.push_back(
        OpCase{"cross_entropy_strip_backward" + shape,
               {in("strip", {n, c}, Kind::floating, sh.strip),
                in("labels", {n}, Kind::i64, strip_labels(begin, c, vocab)),
                in("state", {n, 3}, Kind::f64, states(0.0, 3, 4)), out("dstrip", {n, c})},
               [begin](const std::vector<Tensor>& t, Stream& s) {
                 ops::cross_entropy_strip_backward(t[0], t[1], begin, t[2], 0.37, t[3], s);
               }});
    cases.push_back(OpCase{"cross_entropy_strip_backward in place" + shape,
                           {inout("strip", {n, c}, Kind::floating, sh.strip),
                            in("labels", {n}, Kind::i64, strip_labels(begin, c, vocab)),
                            in("state", {n, 3}, Kind::f64, states(0.0, 3, 4))},
                           [begin](const std::vector<Tensor>& t, Stream& s) {
                             ops::cross_entropy_strip_backward(t[0], t[1], begin, t[2], 1.0 / 7,
                                                               t[0], s);
                           }});
  }

  // Merge: identity rows on either side (and both), maxima near and far apart.
  for (auto [n, lo, hi] :
       std::vector<std::tuple<int64_t, double, double>>{{37, -3, 3}, {500, -30, 30}, {0, -3, 3}}) {
    cases.push_back(OpCase{"cross_entropy_state_merge N=" + std::to_string(n) + " m in [" +
                               std::to_string(int(lo)) + ", " + std::to_string(int(hi)) + ")",
                           {in("partial", {n, 3}, Kind::f64, states(0.3, lo, hi)),
                            inout("state", {n, 3}, Kind::f64, states(0.3, lo, hi))},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::cross_entropy_state_merge(t[0], t[1], s);
                           }});
  }

  // The whole fold as Ring-DTP runs it: strips [0, 300) and [300, 813) into the state, strip
  // [813, 877) into a partial state merged in, then the middle strip's gradient.
  for (auto [name, strips] : std::vector<std::pair<std::string, Generator>>{
           {"", normal(2.0)}, {" large", uniform(-30, 30)}}) {
    const int64_t n = 23;
    cases.push_back(OpCase{
        "cross_entropy_strip fold of 3 strips" + name + " N=23 V=877",
        {in("strip0", {n, 300}, Kind::floating, strips),
         in("strip1", {n, 513}, Kind::floating, strips),
         in("strip2", {n, 64}, Kind::floating, strips),
         in("labels", {n}, Kind::i64, strip_labels(300, 513, 877)), out("state", {n, 3}, Kind::f64),
         out("partial", {n, 3}, Kind::f64), out("dstrip1", {n, 513})},
        [](const std::vector<Tensor>& t, Stream& s) {
          ops::cross_entropy_state_init(t[4], s);
          ops::cross_entropy_strip_forward(t[0], t[3], 0, t[4], s);
          ops::cross_entropy_strip_forward(t[1], t[3], 300, t[4], s);
          ops::cross_entropy_state_init(t[5], s);
          ops::cross_entropy_strip_forward(t[2], t[3], 813, t[5], s);
          ops::cross_entropy_state_merge(t[5], t[4], s);
          ops::cross_entropy_strip_backward(t[1], t[3], 300, t[4], 0.5, t[6], s);
        }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
