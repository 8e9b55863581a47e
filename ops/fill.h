// fill: sets every element of a tensor to one value, converted to the tensor's dtype.
// Tests poison outputs with NaN before a run, so an element an op forgets to write fails.
//
//   out: any shape, any dtype (f32, bf16, f64, i32, i64)
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void fill_cpu(const Tensor& out, double value, Stream& stream);
void fill_cuda(const Tensor& out, double value, Stream& stream);

inline void fill(const Tensor& out, double value, Stream& stream) {
  if (!runs_on_cuda(out)) return fill_cpu(out, value, stream);
#ifdef MOEPEAK_WITH_CUDA
  fill_cuda(out, value, stream);
#else
  throw_no_cuda("fill");
#endif
}

// The element's bytes for `value` in dtype `t` (bf16 rounded to nearest even), as a 64-bit
// pattern in the low bytes. Shared by both backends so they write identical bits.
uint64_t fill_pattern(DType t, double value);

}  // namespace moepeak::ops
