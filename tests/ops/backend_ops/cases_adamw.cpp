// test_backend_ops cases: adamw (ops/adamw.h) and adamw_fused (ops/adamw_fused.h).
//
// adamw: param, grad, m, v are Kind::state — f32 under test, f64 in the reference — and run
// without bf16 storage (the op takes one dtype, f32 in training). adamw_fused: master, m, v are
// Kind::state and grad, working Kind::floating, so the reference runs everything in f64 (which
// adamw_fused_cpu supports: working dtype = state dtype) and the backend under test (CUDA, or
// the CPU) runs an f32 master with f32 working weights, and with bf16 ones (the gradient then
// holds bf16 values in both runs). adamw_fused f32_grad: the gradient Kind::state, so the bf16
// run passes an f32 gradient with bf16 working weights (the fp32 main gradient; its f32 run is
// the plain fused case again).
//
// Values keep every output well conditioned, since the harness measures error relative to the
// largest reference element (with n = 1, to that element alone): |param| in [0.5, 1.5) and |m| in
// [2e-3, 1e-2) with random signs, |grad| < 1e-2, v in [1e-5, 1e-4) (about g^2; a second moment
// is never negative). Then no result cancels: |new m| >= 0.9 * 2e-3 - 0.1 * 1e-2 = 8e-4,
// sqrt(v) is of m's scale, so the step is at most about lr / (1 - beta1^t) = 1e-2, far below
// |param|. Every combination of decay on/off, step 1 and 1000 (bias correction large and
// negligible) and grad_scale 1 and 0.37, for n = 1, 7 (part of a warp), 1000 and 100003 (many
// blocks, a ragged end).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "ops/adamw_fused.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

// Magnitudes uniform in [lo, hi), each with a random sign.
Generator signed_uniform(double lo, double hi) {
  return [lo, hi](std::mt19937_64& rng, int64_t n) {
    std::uniform_real_distribution<double> magnitude(lo, hi);
    std::bernoulli_distribution negative(0.5);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      x = magnitude(rng);
      if (negative(rng)) x = -x;
    }
    return v;
  };
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(adamw) {
  std::vector<OpCase> cases;
  uint64_t seed = 1;
  for (int64_t n : {1, 7, 1000, 100003}) {
    for (bool decay : {true, false}) {
      for (int64_t step : {1, 1000}) {
        for (double grad_scale : {1.0, 0.37}) {
          ops::AdamWHyper h;
          h.lr = 1e-3;
          h.beta1 = 0.9;
          h.beta2 = 0.95;
          h.eps = 1e-8;
          h.weight_decay = 0.1;
          h.step = step;
          h.grad_scale = grad_scale;
          char buf[96];
          std::snprintf(buf, sizeof buf, " n=%lld decay=%d step=%lld grad_scale=%g",
                        static_cast<long long>(n), decay ? 1 : 0, static_cast<long long>(step),
                        grad_scale);
          const std::string params = buf;
          const Shape s{n};

          // The tensors both ops update in place: param (master), m, v.
          auto param = [&](const char* name) {
            return inout(name, s, Kind::state, signed_uniform(0.5, 1.5));
          };
          auto m = inout("m", s, Kind::state, signed_uniform(2e-3, 1e-2));
          auto v = inout("v", s, Kind::state, uniform(1e-5, 1e-4));

          OpCase plain{"adamw" + params,
                       {param("param"), in("grad", s, Kind::state, uniform(-1e-2, 1e-2)), m, v},
                       [h, decay](const std::vector<Tensor>& t, Stream& st) {
                         ops::adamw(t[0], t[1], t[2], t[3], h, decay, st);
                       }};
          plain.bf16 = false;  // one dtype for all four; bf16 storage would be the f32 run again
          plain.seed = seed;
          cases.push_back(std::move(plain));

          // The gradient in the working dtype (floating), or f32 beside bf16 working weights
          // (state: the fp32 main gradient).
          for (Kind grad : {Kind::floating, Kind::state}) {
            OpCase fused{
                std::string(grad == Kind::state ? "adamw_fused f32_grad" : "adamw_fused") + params,
                {param("master"), in("grad", s, grad, uniform(-1e-2, 1e-2)), m, v,
                 out("working", s, Kind::floating)},
                [h, decay](const std::vector<Tensor>& t, Stream& st) {
                  ops::adamw_fused(t[0], t[1], t[2], t[3], t[4], h, decay, st);
                }};
            fused.seed = seed;
            cases.push_back(std::move(fused));
          }
          ++seed;
        }
      }
    }
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
