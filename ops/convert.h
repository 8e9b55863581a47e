// convert: element-wise dtype conversion between floating types (f32, bf16, f64), e.g. fp32
// master weights to bf16 working weights, or a bf16 result to f64 for comparison in tests.
// Rounding to bf16 is round-to-nearest-even on both backends.
//
//   in:  any shape, f32 | bf16 | f64
//   out: same number of elements, f32 | bf16 | f64
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void convert_cpu(const Tensor& in, const Tensor& out, Stream& stream);
void convert_cuda(const Tensor& in, const Tensor& out, Stream& stream);

inline void convert(const Tensor& in, const Tensor& out, Stream& stream) {
  if (!runs_on_cuda(out)) return convert_cpu(in, out, stream);
#ifdef MOEPEAK_WITH_CUDA
  convert_cuda(in, out, stream);
#else
  throw_no_cuda("convert");
#endif
}

// Throws unless in/out are floating types with the same element count.
void check_convert_args(const Tensor& in, const Tensor& out);

}  // namespace moepeak::ops
