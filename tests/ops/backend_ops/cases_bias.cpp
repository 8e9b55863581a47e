// test_backend_ops cases: the bias ops (ops/bias.h) and their grouped forms (ops/grouped_bias.h).
//   build/tests/ops/test_backend_ops --gtest_filter='*bias*'
//
// Shapes (M, N) cover one row and one column, N not a multiple of the backward's 32 columns, many
// rows for its 16 row lanes (M = 1024, 3000), and M = 0 (y has no rows; dbias unchanged). The
// broadcast is exact in every storage (a copy). The backward accumulates (+=) onto random dbias;
// its column sums are in double, so f32 is within ~1e-7 and bf16 within one rounding of the
// reference. Both also run with an fp32 output beside bf16 storage (Kind::state: an f32 y of a
// bf16 bias, the f32 main gradient dbias of bf16 dy). The biased linear (bias_broadcast, then an
// accumulating linear_forward) checks the composition the decoder uses. The grouped forms run G =
// 4 groups with an empty one, and in the backward an undefined dbias (compared: unchanged).
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/bias.h"
#include "ops/grouped_bias.h"
#include "ops/linear.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

MOEPEAK_BACKEND_OPS_CASES(bias) {
  std::vector<OpCase> cases;
  const std::pair<int64_t, int64_t> shapes[] = {{37, 96},   {1, 1},     {0, 64},  {129, 1000},
                                                {1024, 40}, {3000, 33}, {5, 4100}};
  for (auto [m, n] : shapes) {
    const std::string shape = " M=" + std::to_string(m) + " N=" + std::to_string(n);
    for (Kind acc : {Kind::floating, Kind::state}) {
      const std::string suffix = acc == Kind::state ? " f32 out" : "";
      cases.push_back(OpCase{
          "bias_broadcast" + shape + suffix,
          {in("bias", {n}), out("y", {m, n}, acc)},
          [](const std::vector<Tensor>& t, Stream& s) { ops::bias_broadcast(t[0], t[1], s); }});
      cases.push_back(OpCase{
          "bias_backward" + shape + suffix,
          {in("dy", {m, n}), inout("dbias", {n}, acc)},
          [](const std::vector<Tensor>& t, Stream& s) { ops::bias_backward(t[0], t[1], s); }});
    }
  }

  // y = x W^T + b, as the decoder computes it.
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{37, 64, 96}, {3, 200, 33}}) {
    cases.push_back(OpCase{"bias_broadcast_then_linear M=" + std::to_string(m) +
                               " K=" + std::to_string(k) + " N=" + std::to_string(n),
                           {in("x", {m, k}), in("w", {n, k}), in("b", {n}), out("y", {m, n})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::bias_broadcast(t[2], t[3], s);
                             ops::linear_forward(t[0], t[1], t[3], /*accumulate=*/true, s);
                           }});
  }

  // Grouped: 4 groups, group 1 empty; the backward skips group 3 (an undefined dbias).
  const std::vector<int64_t> offsets = {0, 17, 17, 50, 64};
  constexpr int64_t kN = 40, kM = 64;
  for (Kind acc : {Kind::floating, Kind::state}) {
    const std::string suffix = acc == Kind::state ? " f32 out" : "";
    cases.push_back(OpCase{
        "grouped_bias_broadcast G=4 M=64 N=40" + suffix,
        {in("b0", {kN}), in("b1", {kN}), in("b2", {kN}), in("b3", {kN}), out("y", {kM, kN}, acc)},
        [offsets](const std::vector<Tensor>& t, Stream& s) {
          const std::vector<Tensor> biases{t[0], t[1], t[2], t[3]};
          ops::grouped_bias_broadcast(biases, offsets, t[4], s);
        }});
    cases.push_back(OpCase{"grouped_bias_backward G=4 M=64 N=40" + suffix,
                           {in("dy", {kM, kN}), inout("db0", {kN}, acc), inout("db1", {kN}, acc),
                            inout("db2", {kN}, acc), inout("db3", {kN}, acc)},
                           [offsets](const std::vector<Tensor>& t, Stream& s) {
                             const std::vector<Tensor> dbiases{t[1], t[2], t[3], Tensor()};
                             ops::grouped_bias_backward(t[0], offsets, dbiases, s);
                           }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
