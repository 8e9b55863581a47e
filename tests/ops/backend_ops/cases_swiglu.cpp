// test_backend_ops cases: swiglu forward and backward (ops/swiglu.h).
#include "ops/swiglu.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

MOEPEAK_BACKEND_OPS_CASES(swiglu) {
  std::vector<OpCase> cases;
  // Gate values up to |a| = 12 reach sigmoid's saturation; M = 0 is an expert with no tokens.
  for (auto [m, f] : {std::pair<int64_t, int64_t>{37, 96}, {1, 1}, {0, 64}, {129, 1000}}) {
    std::string shape = " M=" + std::to_string(m) + " F=" + std::to_string(f);
    cases.push_back(OpCase{
        "swiglu_forward" + shape,
        {in("a", {m, f}, Kind::floating, uniform(-12, 12)), in("b", {m, f}), out("h", {m, f})},
        [](const std::vector<Tensor>& t, Stream& s) { ops::swiglu_forward(t[0], t[1], t[2], s); }});
    cases.push_back(OpCase{"swiglu_backward" + shape,
                           {in("a", {m, f}, Kind::floating, uniform(-12, 12)), in("b", {m, f}),
                            in("dh", {m, f}), out("da", {m, f}), out("db", {m, f})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::swiglu_backward(t[0], t[1], t[2], t[3], t[4], s);
                           }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
