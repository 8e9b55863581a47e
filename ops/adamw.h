// adamw: the element-wise AdamW update (decoupled weight decay, bias correction), in the exact
// operation order of torch.optim.AdamW (foreach=False), with the global-norm clipping factor
// applied to the gradient on the way in. Every optimizer placement (resident, offload_serial,
// offload_stream) runs this one kernel, so their results are bitwise equal.
//
//   param, m, v (n)  fp32 (f64 in tests), updated in place;  grad (n) same dtype
//   per element:  g = grad * grad_scale
//                 m = beta1 * m + (1 - beta1) * g
//                 v = beta2 * v + (1 - beta2) * g * g
//                 param *= 1 - lr * weight_decay                    (if decay)
//                 param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

struct AdamWHyper {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;          // t, 1-based
  double grad_scale = 1.0;   // clipping factor (1 = no clipping)
};

void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWHyper& hyper, bool decay, Stream& stream);

}  // namespace moepeak::ops
