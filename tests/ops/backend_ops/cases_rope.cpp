// test_backend_ops cases: rope forward and backward, in place (ops/rope.h).
//
// Head dims from 2 (one pair) through 6 (three pairs, not a multiple of 32) to 128 (Mixtral) and
// 2048 (more pairs than a block's threads); positions small and uniform in [0, 100000] (long
// context, where the angle needs double), with theta 1e4 and 1e6 (Mixtral's); N = 0.
#include <string>

#include "ops/rope.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

struct RopeShape {
  int64_t tokens, heads, head_dim, max_position;
  double theta;
};

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(rope) {
  std::vector<OpCase> cases;
  const RopeShape shapes[] = {
      {37, 4, 64, 4095, 1e4},    {1, 1, 2, 7, 1e4},         {19, 3, 6, 300, 1e4},
      {64, 8, 128, 100000, 1e6}, {33, 2, 128, 100000, 1e4}, {5, 2, 2048, 100000, 1e6},
      {300, 1, 16, 100000, 1e6}, {0, 4, 64, 0, 1e4},
  };
  for (const RopeShape& r : shapes) {
    const std::string shape =
        " N=" + std::to_string(r.tokens) + " heads=" + std::to_string(r.heads) +
        " d=" + std::to_string(r.head_dim) + " max_pos=" + std::to_string(r.max_position) +
        " theta=" + std::to_string(static_cast<int64_t>(r.theta));
    const double theta = r.theta;
    cases.push_back(OpCase{"rope_forward" + shape,
                           {inout("x", {r.tokens, r.heads, r.head_dim}),
                            in("positions", {r.tokens}, Kind::i64, integers(0, r.max_position))},
                           [theta](const std::vector<Tensor>& t, Stream& s) {
                             ops::rope_forward(t[0], t[1], theta, s);
                           }});
    cases.push_back(OpCase{"rope_backward" + shape,
                           {inout("dx", {r.tokens, r.heads, r.head_dim}),
                            in("positions", {r.tokens}, Kind::i64, integers(0, r.max_position))},
                           [theta](const std::vector<Tensor>& t, Stream& s) {
                             ops::rope_backward(t[0], t[1], theta, s);
                           }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
