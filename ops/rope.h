// rope: rotary position embedding in Hugging Face's "rotate_half" convention, applied in place to
// the query or key projections.
//
//   x:         (N, n_heads, d) f32 | f64, d even; rotated in place
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
// tensor's dtype (HF computes them in fp32; double keeps large positions accurate). The rotation
// itself is done in the tensor's dtype.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void rope_forward_cpu(const Tensor& x, const Tensor& positions, double theta, Stream& stream);
void rope_backward_cpu(const Tensor& dx, const Tensor& positions, double theta, Stream& stream);

}  // namespace moepeak::ops
