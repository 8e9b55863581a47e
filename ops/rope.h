// rope: rotary position embedding in Hugging Face's "rotate_half" convention (or interleaved
// pairs), applied in place to the query or key projections, with the frequencies of
// ops/rope_params.h (plain RoPE: RopeParams::standard; the transformers scaling types: rope_params,
// ops/rope_scaling.h).
//
//   x:         (N, n_heads, head_dim) f32 | bf16 | f64 (both backends); rotated in place
//   positions: (N) i64, the global position of each token in its sequence
//   p:         RopeParams; p.rotary_dim even, 0 < rotary_dim <= head_dim
//
// With r = p.rotary_dim, f = p.attention_factor and, for i < r/2, inv_freq_i = rope_inv_freq(p, i),
// angle = position * inv_freq_i, c = f * cos(angle), s = f * sin(angle), pair i is elements
// (lo, hi) = (i, i + r/2) of each head, or (2i, 2i + 1) when p.interleaved:
//   out[lo] = x[lo] * c - x[hi] * s
//   out[hi] = x[hi] * c + x[lo] * s
// Elements [r, head_dim) of each head are not touched (partial rotary). The default type with
// r = head_dim is inv_freq_i = theta^(-2i/d) and f = 1, the plain RoPE.
//
// The backward applies the transposed map (angle -> -angle, the same f: the forward is x -> f R x,
// so dx = f R^T dout) to the gradient in place:
//   dx[lo] =  dout[lo] * c + dout[hi] * s
//   dx[hi] = -dout[lo] * s + dout[hi] * c
//
// Precision: inv_freq, the angle, cos and sin and their product with f are computed in double and
// then rounded to the tensor's compute type (fp32 for f32 and bf16, double for f64; HF computes
// them in fp32, double keeps large positions accurate). The rotation itself is done in the compute
// type and each element is rounded once to the storage type: on the CPU a bf16 result is the f32
// result on the same (bf16) input rounded once to bf16. With f = 1 (every type but yarn) the
// product is exact, so the default type is bitwise the plain RoPE the op has always computed.
//
// CUDA (ops/cuda/rope.cu): one thread per (token, i < r/2) computes inv_freq (rope_inv_freq, the
// CPU's function), the angle, cos and sin in double exactly as above (positions up to ~1e5 and
// beyond stay accurate), rounds f * cos and f * sin to the compute type (fp32 for f32 and bf16
// storage, f64 for f64) and rotates pair i of every head of the token in it, rounding once to the
// storage type. With f32 storage that is the CPU's f32 arithmetic (the compiler may fuse a
// multiply into the add; CUDA's double pow, cos and sin may differ from glibc's in the last bit).
// Test: tests/ops/test_dense_ops.cpp (CPU, plain RoPE; Bf16Storage: bf16 bitwise against f32),
// tests/ops/test_rope_scaling.cpp (CPU: every type, partial rotary and interleaved pairs against a
// float64 reference, the backward as the exact transpose), tests/ops/backend_ops/cases_rope.cpp
// (each backend against the f64 CPU reference, positions up to 100000 included).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"
#include "ops/rope_params.h"

namespace moepeak::ops {

void rope_forward_cpu(const Tensor& x, const Tensor& positions, const RopeParams& p,
                      Stream& stream);
void rope_backward_cpu(const Tensor& dx, const Tensor& positions, const RopeParams& p,
                       Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`):
// x (N, n_heads, head_dim), positions i64 (N), 0 < p.rotary_dim <= head_dim and even, p.base,
// p.factor and p.attention_factor finite and > 0.
void check_rope_args(const char* op, const Tensor& x, const Tensor& positions, const RopeParams& p);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void rope_forward_cuda(const Tensor& x, const Tensor& positions, const RopeParams& p,
                       Stream& stream);
void rope_backward_cuda(const Tensor& dx, const Tensor& positions, const RopeParams& p,
                        Stream& stream);
inline void rope_forward(const Tensor& x, const Tensor& positions, const RopeParams& p,
                         Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rope_forward, x, x, positions, p, stream);
}
inline void rope_backward(const Tensor& dx, const Tensor& positions, const RopeParams& p,
                          Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rope_backward, dx, dx, positions, p, stream);
}

}  // namespace moepeak::ops
