// rmsnorm: Mixtral's RMSNorm (input_layernorm, post_attention_layernorm, model.norm).
//
//   y = x * rstd * w,   rstd[n] = 1 / sqrt(mean_h(x[n, h]^2) + eps)
//
//   x:    (N, H) f32 | f64
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
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void rmsnorm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                         const Tensor& rstd, Stream& stream);

// dx = rstd * (g - xhat * mean_h(g * xhat)) with g = dy * w and xhat = x * rstd.
void rmsnorm_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                          const Tensor& dx, const Tensor& dw, Stream& stream);

}  // namespace moepeak::ops
