// test_backend_ops cases: causal grouped-query attention forward and backward (ops/attention.h).
//
// The backward's out and lse must be those of q, k and v for its formula to mean anything, so a
// backward case runs the forward first on tensors of role `out` (compared too), then the
// backward. Shapes: head dims that are and are not multiples of 32 (8, 24, 16, 40, 64, 128,
// 256), GQA group sizes 1, 2, 3, 4 and 8, sequences that cross the SIMT kernels' 16-row and
// 32-entry tiles and the tensor-core kernels' 64-row and 64-entry ones (bf16 with d = 32, 64,
// 128), B > 1, empty sizes, and a peaky softmax (scale 2, inputs x 2). Every case runs with f32
// and bf16 storage; lse is Kind::state, as it is f32 for both (ops::attention_lse_dtype).
// With MOEPEAK_BACKEND_OPS=cpu, bf16 is the CPU's fp32 algorithm with bf16 loads and stores
// (ops/attention.h): out is within one bf16 rounding (2^-8 of the scale; measured <= 3.3e-3),
// dq, dk, dv slightly more (<= 4.4e-3), as the backward reads the rounded out in D = dout . out;
// CUDA's 1e-2 holds for both.
#include <cmath>
#include <string>

#include "ops/attention.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  double scale;  // 0: 1 / sqrt(d)
  double input;  // standard deviation of q and k
  Tolerance tolerance;
};

std::string describe(const AttentionShape& s) {
  std::string name = " B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
                     " nh=" + std::to_string(s.heads) + " nkv=" + std::to_string(s.kv_heads) +
                     " d=" + std::to_string(s.head_dim);
  if (s.scale != 0) name += " peaky";
  return name;
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(attention) {
  // f32 errors: at most ~1.3e-6 relative (the CPU in f32, and the CUDA kernels' arithmetic run on
  // the CPU); the peaky case (|scale q.k| up to ~100) amplifies score rounding through exp, ~5e-6.
  const Tolerance standard{2e-5, 1e-2};
  const Tolerance peaky{1e-4, 1e-2};
  const AttentionShape shapes[] = {
      {1, 1, 1, 1, 8, 0, 1, standard},     // one query, one key
      {2, 37, 4, 2, 16, 0, 1, standard},   // G = 2, B = 2
      {1, 70, 6, 2, 64, 0, 1, standard},   // G = 3
      {1, 129, 8, 8, 32, 0, 1, standard},  // G = 1, T past 4 key tiles
      {1, 33, 4, 1, 128, 0, 1, standard},  // G = 4
      {2, 19, 3, 1, 24, 0, 1, standard},   // d = 24 (not a multiple of 32), G = 3
      {1, 45, 8, 1, 40, 0, 1, standard},   // d = 40, G = 8: one block holds 2 positions
      {1, 20, 2, 1, 256, 0, 1, standard},  // the largest head dim
      {1, 0, 4, 2, 16, 0, 1, standard},    // T = 0: nothing to do
      {0, 5, 4, 2, 16, 0, 1, standard},    // B = 0
      {1, 50, 4, 2, 32, 2.0, 2, peaky},    // peaky softmax
      // bf16 with d = 32, 64, 128 runs the tensor-core kernels (ops/cuda/attention_tc.cu):
      // 64-row blocks and 64-entry tiles, crossed here in both directions
      {2, 150, 4, 2, 64, 0, 1, standard},   // G = 2, B = 2, 5 row blocks, 3 key tiles
      {1, 130, 2, 2, 128, 0, 1, standard},  // G = 1, T one past 2 tiles
  };
  std::vector<OpCase> cases;
  uint64_t seed = 100;
  for (const AttentionShape& s : shapes) {
    const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
    const Shape kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
    const Shape lse_shape{s.batch, s.heads, s.seq};
    const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim));
    const std::string shape = describe(s);

    OpCase forward{"attention_forward" + shape,
                   {in("q", q_shape, Kind::floating, normal(s.input)),
                    in("k", kv_shape, Kind::floating, normal(s.input)), in("v", kv_shape),
                    out("out", q_shape), out("lse", lse_shape, Kind::state)},
                   [scale](const std::vector<Tensor>& t, Stream& st) {
                     ops::attention_forward(t[0], t[1], t[2], scale, t[3], t[4], st);
                   }};
    forward.tolerance = s.tolerance;
    forward.seed = seed++;
    cases.push_back(std::move(forward));

    OpCase backward{"attention_backward" + shape,
                    {in("q", q_shape, Kind::floating, normal(s.input)),
                     in("k", kv_shape, Kind::floating, normal(s.input)), in("v", kv_shape),
                     in("dout", q_shape), out("out", q_shape), out("lse", lse_shape, Kind::state),
                     out("dq", q_shape), out("dk", kv_shape), out("dv", kv_shape)},
                    [scale](const std::vector<Tensor>& t, Stream& st) {
                      ops::attention_forward(t[0], t[1], t[2], scale, t[4], t[5], st);
                      ops::attention_backward(t[0], t[1], t[2], t[4], t[5], t[3], scale, t[6], t[7],
                                              t[8], st);
                    }};
    backward.tolerance = s.tolerance;
    backward.seed = seed++;
    cases.push_back(std::move(backward));
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
