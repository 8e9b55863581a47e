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
// weight (NormWeightOrder::weight_in_compute_type, the default).
//
// NormWeightOrder, the forward's last argument: where the weight multiplies.
//   weight_in_compute_type  (default; gpt-oss: (w * x_hat_fp32).to(dtype))
//                           y = round((x * rstd) * w), one rounding
//   weight_after_cast       (transformers' Mixtral, Qwen3, LLaMA: w * x_hat.to(dtype))
//                           y = round(round(x * rstd) * w): x_hat is rounded to the storage
//                           dtype first, then multiplied by w in the compute type and rounded
//                           again
// For f32 and f64 storage the two are the same arithmetic (x_hat is computed in the storage
// dtype's own precision, so rounding it to that dtype changes nothing), bitwise; they differ for
// bf16 only. The backward is the same for both: it differentiates y = x * rstd * w with the
// unrounded x_hat, so for weight_after_cast in bf16 it differs from autograd's (which works with
// the bf16-rounded x_hat, in dw's product for one) by bf16 rounding only.
//
// The backward computes in double (the row reduction, dx, and the dw column sums over rows in
// increasing n) and rounds once at the end, so results are bitwise reproducible.
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
// as on the CPU. It runs before the dx kernel, so dx may be x or dy. weight_after_cast: the same
// kernel, with x * rstd rounded to bf16 (and back to fp32) before the product with w.
//
// CPU with bf16 storage (ops/cpu/rmsnorm.cpp): the CUDA semantics above with the CPU's orders.
// Elements are read into fp32 (double for the statistics); rstd is rounded to fp32, stored
// rounded to bf16, and y = (x * rstd) * w uses the fp32 value and is rounded to bf16 once. The
// backward reads the stored (bf16) rstd, computes dx in double and rounds it to fp32 and then to
// bf16 (as CUDA's store does); dw[h] = bf16(fp32(dw[h]) + fp32(column sum)), or for an f32 dw
// dw[h] += fp32(column sum). So every bf16 output is the CPU's f32 result on the same (bf16)
// inputs rounded once to bf16, and differs from CUDA's only by the summation order. (With
// weight_after_cast y is bf16(bf16(x * rstd) * w) instead: the rounding of x_hat is the order's.)
// N == 0 is allowed (nothing is written; dw unchanged).
// Test: tests/ops/test_dense_ops.cpp (CPU; Bf16Storage: bf16 bitwise against f32),
// tests/ops/test_gpt_oss_router_norm.cpp (NormWeightOrder), tests/ops/backend_ops/cases_rmsnorm.cpp
// (each backend against the f64 CPU reference).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// Where the forward multiplies by the weight (see above).
enum class NormWeightOrder {
  weight_in_compute_type,  // y = round((x * rstd) * w): today's order, gpt-oss's
  weight_after_cast,       // y = round(round(x * rstd) * w): LLaMA's, Mixtral's, Qwen3's
};

// NOTES: `order` comes after the stream (the one exception to ops/op_common.h's "stream last")
// so that it can default to today's order and every existing call reads as before.
void rmsnorm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                         const Tensor& rstd, Stream& stream,
                         NormWeightOrder order = NormWeightOrder::weight_in_compute_type);

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
                          const Tensor& rstd, Stream& stream,
                          NormWeightOrder order = NormWeightOrder::weight_in_compute_type);
void rmsnorm_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           const Tensor& dx, const Tensor& dw, Stream& stream);
inline void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                            const Tensor& rstd, Stream& stream,
                            NormWeightOrder order = NormWeightOrder::weight_in_compute_type) {
  MOEPEAK_OP_ON_BACKEND(rmsnorm_forward, y, x, w, eps, y, rstd, stream, order);
}
inline void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                             const Tensor& dx, const Tensor& dw, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(rmsnorm_backward, dx, x, w, rstd, dy, dx, dw, stream);
}

}  // namespace moepeak::ops
