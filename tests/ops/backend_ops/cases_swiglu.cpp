// test_backend_ops cases: swiglu forward and backward (ops/swiglu.h), plain and clamped.
//
// The clamped cases (gpt-oss: limit 7, alpha 1.702, up_offset 1; and limit 2.5, alpha 0.7,
// up_offset -0.3) draw a and b across +-1.6 limit, with every fifth element exactly +limit or
// -limit (exact in bf16), so the clamps, their inclusive gradient bounds and the zero gradient
// beyond them all run; both runs see the same values, so every mask decision agrees.
#include <string>
#include <utility>
#include <vector>

#include "ops/swiglu.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {
namespace {

// Uniform in [-1.6 limit, 1.6 limit), every fifth element +limit or -limit in turn.
Generator across_bounds(double limit) {
  return [limit](std::mt19937_64& rng, int64_t n) {
    std::vector<double> v = uniform(-1.6 * limit, 1.6 * limit)(rng, n);
    for (int64_t i = 0; i < n; i += 5) v[i] = (i / 5) % 2 == 0 ? limit : -limit;
    return v;
  };
}

}  // namespace

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
  for (const ops::SwigluParams& p :
       {ops::SwigluParams::gpt_oss(), ops::SwigluParams{0.7, 2.5, -0.3}}) {
    const std::string params = " limit=" + std::to_string(p.limit).substr(0, 3);
    for (auto [m, f] : {std::pair<int64_t, int64_t>{37, 96}, {0, 64}, {129, 1000}}) {
      const std::string shape = " M=" + std::to_string(m) + " F=" + std::to_string(f) + params;
      cases.push_back(
          OpCase{"swiglu_clamped_forward" + shape,
                 {in("a", {m, f}, Kind::floating, across_bounds(p.limit)),
                  in("b", {m, f}, Kind::floating, across_bounds(p.limit)), out("h", {m, f})},
                 [p](const std::vector<Tensor>& t, Stream& s) {
                   ops::swiglu_forward(t[0], t[1], p, t[2], s);
                 }});
      cases.push_back(OpCase{"swiglu_clamped_backward" + shape,
                             {in("a", {m, f}, Kind::floating, across_bounds(p.limit)),
                              in("b", {m, f}, Kind::floating, across_bounds(p.limit)),
                              in("dh", {m, f}), out("da", {m, f}), out("db", {m, f})},
                             [p](const std::vector<Tensor>& t, Stream& s) {
                               ops::swiglu_backward(t[0], t[1], t[2], p, t[3], t[4], s);
                             }});
    }
  }
  // In place (da over a, db over b), as the plain op allows.
  cases.push_back(
      OpCase{"swiglu_clamped_backward in place M=37 F=96",
             {inout("a_da", {37, 96}, Kind::floating, across_bounds(7.0)),
              inout("b_db", {37, 96}, Kind::floating, across_bounds(7.0)), in("dh", {37, 96})},
             [](const std::vector<Tensor>& t, Stream& s) {
               ops::swiglu_backward(t[0], t[1], t[2], ops::SwigluParams::gpt_oss(), t[0], t[1], s);
             }});
  return cases;
}

}  // namespace moepeak::testing::backend_ops
