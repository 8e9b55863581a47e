// test_backend_ops cases: rmsnorm forward and backward (ops/rmsnorm.h).
//
// Shapes cover one row and one column, H not a multiple of 32, H above the 256 threads of a row
// block and above 1024, many rows for dw's column sums over 16 row lanes (N = 1024, 3000), and
// N = 0. w and rstd are drawn away from zero, as in a model (rstd of the backward is an input:
// the formulas hold for any value, so it need not be the forward's). The backward also runs with
// dx == dy (in place), which both backends allow; dw is accumulated (+=) onto random values.
#include <string>
#include <utility>

#include "ops/rmsnorm.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

MOEPEAK_BACKEND_OPS_CASES(rmsnorm) {
  std::vector<OpCase> cases;
  const std::pair<int64_t, int64_t> shapes[] = {{37, 96},   {1, 1},     {5, 1000},
                                                {3, 4096},  {1, 5000},  {300, 67},
                                                {1024, 40}, {3000, 33}, {0, 64}};
  for (auto [n, h] : shapes) {
    const std::string shape = " N=" + std::to_string(n) + " H=" + std::to_string(h);
    const double eps = h == 1 ? 1e-6 : 1e-5;
    cases.push_back(OpCase{"rmsnorm_forward" + shape,
                           {in("x", {n, h}), in("w", {h}, Kind::floating, uniform(0.5, 1.5)),
                            out("y", {n, h}), out("rstd", {n})},
                           [eps](const std::vector<Tensor>& t, Stream& s) {
                             ops::rmsnorm_forward(t[0], t[1], eps, t[2], t[3], s);
                           }});
    cases.push_back(OpCase{"rmsnorm_backward" + shape,
                           {in("x", {n, h}), in("w", {h}, Kind::floating, uniform(0.5, 1.5)),
                            in("rstd", {n}, Kind::floating, uniform(0.5, 2.0)), in("dy", {n, h}),
                            out("dx", {n, h}), inout("dw", {h})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], s);
                           }});
  }
  // In place: dx written over dy.
  for (auto [n, h] : {std::pair<int64_t, int64_t>{37, 96}, {4, 1500}}) {
    const std::string shape = " N=" + std::to_string(n) + " H=" + std::to_string(h);
    cases.push_back(OpCase{"rmsnorm_backward dx=dy" + shape,
                           {in("x", {n, h}), in("w", {h}, Kind::floating, uniform(0.5, 1.5)),
                            in("rstd", {n}, Kind::floating, uniform(0.5, 2.0)),
                            inout("dy_dx", {n, h}), inout("dw", {h})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[3], t[4], s);
                           }});
  }
  // The forward then the backward on its rstd, as the model runs them.
  cases.push_back(OpCase{"rmsnorm_forward_then_backward N=64 H=4096",
                         {in("x", {64, 4096}), in("w", {4096}, Kind::floating, uniform(0.5, 1.5)),
                          out("y", {64, 4096}), out("rstd", {64}), in("dy", {64, 4096}),
                          out("dx", {64, 4096}), inout("dw", {4096})},
                         [](const std::vector<Tensor>& t, Stream& s) {
                           ops::rmsnorm_forward(t[0], t[1], 1e-5, t[2], t[3], s);
                           ops::rmsnorm_backward(t[0], t[1], t[3], t[4], t[5], t[6], s);
                         }});
  // The fp32 main gradient: an f32 dw for bf16 x (ops/rmsnorm.h, both backends). dw's column
  // sums are in double and added in fp32, but the case's bf16 tolerance is dx's (bf16);
  // test_dense_ops checks dw bitwise against the f32 path on the CPU.
  for (auto [n, h] : {std::pair<int64_t, int64_t>{37, 96}, {3000, 33}}) {
    OpCase main_grad{"rmsnorm_backward f32 dw N=" + std::to_string(n) + " H=" + std::to_string(h),
                     {in("x", {n, h}), in("w", {h}, Kind::floating, uniform(0.5, 1.5)),
                      in("rstd", {n}, Kind::floating, uniform(0.5, 2.0)), in("dy", {n, h}),
                      out("dx", {n, h}), inout("dw", {h}, Kind::state)},
                     [](const std::vector<Tensor>& t, Stream& s) {
                       ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], s);
                     }};
    cases.push_back(std::move(main_grad));
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
