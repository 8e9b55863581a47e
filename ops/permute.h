// permute: expert dispatch and combine of the standard schedule. Routed (token, expert) pairs are
// laid out expert by expert; `index` maps each routed row back to its token.
//
//   gather_rows:          src (N, H), index (M) i32, dst (M, H)       dst[i] = src[index[i]]   (=)
//   scatter_add_rows:     src (M, H), index (M) i32, dst (N, H)       dst[index[i]] += src[i]  (+=)
//   combine_rows:         y (M, H), index (M) i32, weight (M), out (N, H)
//                                                      out[index[i]] += weight[i] * y[i]       (+=)
//   combine_rows_backward: dout (N, H), y (M, H), index (M) i32, weight (M),
//                          dy (M, H)     dy[i] = weight[i] * dout[index[i]]                    (=)
//                          dweight (M)   dweight[i] = sum_h dout[index[i], h] * y[i, h]        (=)
//
// Float tensors share one dtype (f32 | f64). The additions run in increasing i, so a token that
// several experts (or chunks) send back sums them in a fixed order: bitwise reproducible. The
// dweight dot products accumulate in double; dy may be y itself (each row of y is read before it
// is overwritten). An index outside [0, N) makes the stream task throw a moepeak::Error naming the
// position and the index (it surfaces at synchronize()); every index is checked before anything
// is written. M == 0 is allowed.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void gather_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream);
void scatter_add_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst,
                          Stream& stream);
void combine_rows_cpu(const Tensor& y, const Tensor& index, const Tensor& weight, const Tensor& out,
                      Stream& stream);
void combine_rows_backward_cpu(const Tensor& dout, const Tensor& y, const Tensor& index,
                               const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                               Stream& stream);

}  // namespace moepeak::ops
