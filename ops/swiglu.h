// swiglu: the gated activation inside each Mixtral expert, h = silu(w1 x) * (w3 x).
//
//   a:  (M, F) f32 | f64   the gate, w1 x
//   b:  (M, F) same dtype  the up projection, w3 x
//   h:  (M, F)             h = silu(a) * b, silu(a) = a * sigmoid(a)      (written, =)
//   dh: (M, F)
//   da: (M, F)             da = dh * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))   (written, =)
//   db: (M, F)             db = dh * silu(a)                              (written, =)
//
// Element-wise in the tensors' dtype; sigmoid(a) = 1 / (1 + exp(-a)), which saturates cleanly
// to 0 or 1 for large |a|. M == 0 is allowed.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream);
void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                         const Tensor& db, Stream& stream);

}  // namespace moepeak::ops
