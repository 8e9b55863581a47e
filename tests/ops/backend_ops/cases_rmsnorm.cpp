// test_backend_ops cases: rmsnorm forward and backward (ops/rmsnorm.h).
//
// Shapes cover one row and one column, H not a multiple of 32, H above the 256 threads of a row
// block and above 1024, many rows for dw's column sums over 16 row lanes (N = 1024, 3000), and
// N = 0. w and rstd are drawn away from zero, as in a model (rstd of the backward is an input:
// the formulas hold for any value, so it need not be the forward's). The backward also runs with
// dx == dy (in place), which both backends allow; dw is accumulated (+=) onto random values.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime/dtype.h"
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
  // NormWeightOrder::weight_after_cast (LLaMA's order): x_hat rounded to the storage dtype before
  // the product with w, so bf16 takes two roundings (2^-8 each of the element at most: within
  // the default 1e-2 of the scale); f32 is the default order's arithmetic.
  for (auto [n, h] : {std::pair<int64_t, int64_t>{37, 96}, {1, 1}, {3, 4096}, {300, 67}, {0, 64}}) {
    cases.push_back(OpCase{
        "rmsnorm_forward weight_after_cast N=" + std::to_string(n) + " H=" + std::to_string(h),
        {in("x", {n, h}), in("w", {h}, Kind::floating, uniform(0.5, 1.5)), out("y", {n, h}),
         out("rstd", {n})},
        [](const std::vector<Tensor>& t, Stream& s) {
          ops::rmsnorm_forward(t[0], t[1], 1e-5, t[2], t[3], s,
                               ops::NormWeightOrder::weight_after_cast);
        }});
  }
  return cases;
}

// The cases above compare with the f64 CPU, where both NormWeightOrders are one arithmetic, and
// bf16's tolerance cannot tell one rounding of x_hat from none. Here the backend under test is
// compared bit for bit with the CPU in bf16, in both orders: with bf16 x of magnitudes in
// [0.25, 4] every square and their sum are exact in double (whatever the summation order), so
// both backends compute the same fp32 rstd (IEEE double division and square root, one rounding
// to fp32), and y is then the same few fp32 operations and one or two bf16 roundings.
TEST(BackendRmsnormOrder, Bf16IsTheCpusBitwiseInBothOrders) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  constexpr int64_t N = 37, H = 300;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> magnitude(0.25, 4.0), weight(0.5, 1.5);
  std::vector<double> x(N * H), w(H);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(bf16(static_cast<float>((i % 3 == 0 ? -1 : 1) * magnitude(rng))));
  }
  for (auto& v : w) v = static_cast<float>(bf16(static_cast<float>(weight(rng))));
  auto run = [&](Backend& backend, ops::NormWeightOrder order) {
    Stream& stream = backend.default_stream();
    auto make = [&](Shape shape) {
      return OwnedTensor::device(backend, shape, DType::bf16, LiveSet::workspace, "order check");
    };
    OwnedTensor xt = make({N, H}), wt = make({H}), y = make({N, H}), rstd = make({N});
    copy_from_host_as(x, xt, backend, stream);
    copy_from_host_as(w, wt, backend, stream);
    ops::rmsnorm_forward(xt, wt, 1e-5, y, rstd, stream, order);
    return copy_to_host_as_double(y, backend, stream);
  };
  const auto after = ops::NormWeightOrder::weight_after_cast;
  const auto in_compute = ops::NormWeightOrder::weight_in_compute_type;
  const std::vector<double> cpu_after = run(reference_backend(), after);
  const std::vector<double> cpu_in = run(reference_backend(), in_compute);
  EXPECT_NE(cpu_after, cpu_in);  // the orders differ in bf16
  EXPECT_EQ(run(backend_under_test(), after), cpu_after);
  EXPECT_EQ(run(backend_under_test(), in_compute), cpu_in);
}

}  // namespace moepeak::testing::backend_ops
