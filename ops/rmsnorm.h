// rmsnorm: Mixtral's RMSNorm (input_layernorm, post_attention_layernorm, model.norm).
//
//   y = x * rstd * w,   rstd[n] = 1 / sqrt(mean_h(x[n, h]^2) + eps)
//
//   x:    (N, H) f32 | f64 on the CPU; f32 | bf16 | f64 on CUDA
//   w:    (H)    same dtype
//   y:    (N, H)                                          (written, =)
//   rstd: (N)    saved for the backward                   (written, =)
//   dy:   (N, H)
//   dx:   (N, H)                                          (written, =)
//   dw:   (H)    dw[h] += sum_n dy[n, h] * x[n, h] * rstd[n]   (accumulated, +=)
//
// Precision: the mean of squares is accumulated in double for both float and double (at least
// the fp32 Hugging Face uses), then rstd is rounded to the tensors' dtype; y is (x * rstd) * w in
// that dtype, as HF multiplies the normalised row by the weight. The backward computes in double
// (the row reduction, dx, and the dw column sums over rows in increasing n) and rounds once at the
// end, so results are bitwise reproducible.
//
// CUDA (ops/cuda/rmsnorm.cu): a block per row; the sum of squares, the backward's row dot and
// its arithmetic are in double as on the CPU (only the order of the additions differs: a block
// reduction). rstd is rounded to the compute type (fp32 for f32 and bf16 storage) and y = (x *
// rstd) * w is computed in it and rounded once, so with f32 storage rstd and y are the CPU's
// f32 results up to that summation order; with bf16 storage rstd is stored rounded to bf16 but y
// uses the fp32 value (one rounding, to bf16, at the end). dw is deterministic without atomics: a
// second kernel owns each column, sums its rows in double over a fixed split (16 row lanes, added
// in lane order) and adds the total to dw[h] once, so it is reproducible run to run, though not
// bitwise the CPU's increasing-n order. It runs before the dx kernel, so dx may be x or dy.
// N == 0 is allowed (nothing is written; dw unchanged).
// Test: tests/ops/test_dense_ops.cpp (CPU), tests/ops/backend_ops/cases_rmsnorm.cpp (CUDA
// against the f64 CPU reference).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void rmsnorm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                         const Tensor& rstd, Stream& stream);

// dx = rstd * (g - xhat * mean_h(g * xhat)) with g = dy * w and xhat = x * rstd.
void rmsnorm_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                          const Tensor& dx, const Tensor& dw, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_rmsnorm_forward_args(const char* op, const Tensor& x, const Tensor& w, double eps,
                                const Tensor& y, const Tensor& rstd);
void check_rmsnorm_backward_args(const char* op, const Tensor& x, const Tensor& w,
                                 const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                 const Tensor& dw);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void rmsnorm_forward_cuda(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                          const Tensor& rstd, Stream& stream);
void rmsnorm_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           const Tensor& dx, const Tensor& dw, Stream& stream);
inline void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                            const Tensor& rstd, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rmsnorm_forward, y, x, w, eps, y, rstd, stream);
}
inline void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                             const Tensor& dx, const Tensor& dw, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rmsnorm_backward, dx, x, w, rstd, dy, dx, dw, stream);
}

}  // namespace moepeak::ops
