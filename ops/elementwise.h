// elementwise: small whole-tensor helpers for residual adds, gradient scaling and clipping, and
// copies between activation buffers.
//
//   add_cpu(a, b, out)      out = a + b; a, b, out of one shape and float dtype; out may be a or b
//                                                                                   (written, =)
//   scale_cpu(x, alpha)     x *= alpha in place, in x's dtype (alpha rounded to it first)
//   sum_squares_cpu(x, out) out[0] += sum_i x[i]^2; x float of any shape, out (1) f64. The sum is
//                           accumulated in double in index order from 0 and then added to out[0],
//                           so a tensor's contribution does not depend on what out held (global
//                           gradient norms sum the tensors' contributions in call order)  (+=)
//   copy_cpu(src, dst)      dst = src; same shape and dtype, any dtype          (written, =)
//   scale_rows_cpu(x, w)    x[i, :] *= w[i]; x (M, C) float, w (M) of x's dtype     (in place)
//   row_dot_cpu(a, b, out, accumulate)
//                           out[i] (+)= sum_c a[i, c] * b[i, c]; a, b (M, C), out (M), one
//                           float dtype; each dot accumulated in double in c order, then rounded
//                           to out's dtype and written (=) or added (+=)
// (the two halves of combine_rows_backward for rows already in order, used per F block by the
// blocked expert MLP of ops/schedules/dispatch_pipelined_llep.cpp)
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream);
void scale_cpu(const Tensor& x, double alpha, Stream& stream);
void sum_squares_cpu(const Tensor& x, const Tensor& out, Stream& stream);
void copy_cpu(const Tensor& src, const Tensor& dst, Stream& stream);
void scale_rows_cpu(const Tensor& x, const Tensor& weight, Stream& stream);
void row_dot_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                 Stream& stream);

}  // namespace moepeak::ops
