// rope: rotary position embedding in Hugging Face's "rotate_half" convention, applied in place to
// the query or key projections.
//
//   x:         (N, n_heads, d) f32 | bf16 | f64 (both backends), d even; rotated in place
//   positions: (N) i64, the global position of each token in its sequence
//
// For i < d/2: inv_freq_i = theta^(-2i/d), angle = position * inv_freq_i,
//   out[i]       = x[i] * cos(angle) - x[i + d/2] * sin(angle)
//   out[i + d/2] = x[i + d/2] * cos(angle) + x[i] * sin(angle)
//
// The backward applies the transposed rotation (angle -> -angle) to the gradient in place:
//   dx[i]       =  dout[i] * cos + dout[i + d/2] * sin
//   dx[i + d/2] = -dout[i] * sin + dout[i + d/2] * cos
//
// Precision: inv_freq, the angle, cos and sin are computed in double and then rounded to the
// tensor's compute type (fp32 for f32 and bf16, double for f64; HF computes them in fp32, double
// keeps large positions accurate). The rotation itself is done in the compute type and each
// element is rounded once to the storage type: on the CPU a bf16 result is the f32 result on the
// same (bf16) input rounded once to bf16.
//
// CUDA (ops/cuda/rope.cu): one thread per (token, i < d/2) computes inv_freq, the angle, cos and
// sin in double exactly as above (positions up to ~1e5 and beyond stay accurate), rounds cos and
// sin to the compute type (fp32 for f32 and bf16 storage, f64 for f64) and rotates element pair
// (i, i + d/2) of every head of the token in it, rounding once to the storage type. With f32
// storage that is the CPU's f32 arithmetic (the compiler may fuse a multiply into the add).
// Test: tests/ops/test_dense_ops.cpp (CPU; Bf16Storage: bf16 bitwise against f32),
// tests/ops/backend_ops/cases_rope.cpp (each backend against the f64 CPU reference, positions up
// to 100000 included).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void rope_forward_cpu(const Tensor& x, const Tensor& positions, double theta, Stream& stream);
void rope_backward_cpu(const Tensor& dx, const Tensor& positions, double theta, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_rope_args(const char* op, const Tensor& x, const Tensor& positions, double theta);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void rope_forward_cuda(const Tensor& x, const Tensor& positions, double theta, Stream& stream);
void rope_backward_cuda(const Tensor& dx, const Tensor& positions, double theta, Stream& stream);
inline void rope_forward(const Tensor& x, const Tensor& positions, double theta, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rope_forward, x, x, positions, theta, stream);
}
inline void rope_backward(const Tensor& dx, const Tensor& positions, double theta, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rope_backward, dx, dx, positions, theta, stream);
}

}  // namespace moepeak::ops
