// rmsnorm: the decoder's RMSNorm (input_layernorm, post_attention_layernorm, model.norm, and
// Qwen3-MoE's per-head q_norm and k_norm over rows of head_dim).
//
//   y = x * rstd * w,   rstd[n] = 1 / sqrt(mean_h(x[n, h]^2) + eps)
//
//   x:    (N, H) f32 | bf16 | f64 (both backends)
//   w:    (H)    same dtype
//   y:    (N, H)                                          (written, =)
//   rstd: (N)    saved for the backward                   (written, =)
//   dy:   (N, H)
//   dx:   (N, H)                                          (written, =)
//   dw:   (H)    dw[h] += sum_n dy[n, h] * x[n, h] * rstd[n]   (accumulated, +=)
//                x's dtype, or f32 when x is bf16 (the fp32 main gradient: the column sum is
//                rounded to fp32 and added in fp32, no bf16 rounding), on both backends
//
// Precision: the mean of squares is accumulated in double for both float and double (at least
// the fp32 Hugging Face uses), then rstd is rounded to the tensors' compute type (fp32 for f32 and
// bf16 storage); y is (x * rstd) * w in that type, as HF multiplies the normalised row by the
// weight. The backward computes in double (the row reduction, dx, and the dw column sums over
// rows in increasing n) and rounds once at the end, so results are bitwise reproducible.
//
// CUDA (ops/cuda/rmsnorm.cu): a block per row; the sum of squares, the backward's row dot and
// its arithmetic are in double as on the CPU (only the order of the additions differs: a block
// reduction). rstd is rounded to the compute type (fp32 for f32 and bf16 storage) and y = (x *
// rstd) * w is computed in it and rounded once, so with f32 storage rstd and y are the CPU's
// f32 results up to that summation order; with bf16 storage rstd is stored rounded to bf16 but y
// uses the fp32 value (one rounding, to bf16, at the end). dw is deterministic without atomics: a
// second kernel owns each column, sums its rows in double over a fixed split (16 row lanes, added
// in lane order) and adds the total to dw[h] once, so it is reproducible run to run, though not
// bitwise the CPU's increasing-n order; an f32 dw of bf16 x takes dw[h] += fp32(total) in fp32,
// as on the CPU. It runs before the dx kernel, so dx may be x or dy.
//
// CPU with bf16 storage (ops/cpu/rmsnorm.cpp): the CUDA semantics above with the CPU's orders.
// Elements are read into fp32 (double for the statistics); rstd is rounded to fp32, stored
// rounded to bf16, and y = (x * rstd) * w uses the fp32 value and is rounded to bf16 once. The
// backward reads the stored (bf16) rstd, computes dx in double and rounds it to fp32 and then to
// bf16 (as CUDA's store does); dw[h] = bf16(fp32(dw[h]) + fp32(column sum)), or for an f32 dw
// dw[h] += fp32(column sum). So every bf16 output is the CPU's f32 result on the same (bf16)
// inputs rounded once to bf16, and differs from CUDA's only by the summation order.
// N == 0 is allowed (nothing is written; dw unchanged).
// Test: tests/ops/test_dense_ops.cpp (CPU; Bf16Storage: bf16 bitwise against f32),
// tests/ops/backend_ops/cases_rmsnorm.cpp (each backend against the f64 CPU reference).
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
// dw has x's dtype, or f32 when x is bf16 (the fp32 main gradient).
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
