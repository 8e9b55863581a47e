// CUDA copy_2d (ops/copy_2d.h): one cudaMemcpy2DAsync on the stream, the direction inferred from
// the pointers (device arena or pinned host memory on either side). Host code only.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_copy_2d.cpp).
#include "ops/copy_2d.h"

#include <cuda_runtime_api.h>

#include "core/runtime/cuda_check.h"

namespace moepeak::ops {

void copy_2d_cuda(const Tensor& src, Block2d from, const Tensor& dst, Block2d to, int64_t rows,
                  int64_t width, Stream& stream) {
  check_copy_2d_args("copy_2d_cuda", src, from, dst, to, rows, width);
  if (rows == 0 || width == 0) return;
  const size_t es = dtype_size(src.dtype());
  const char* in = static_cast<const char*>(src.data()) + static_cast<size_t>(from.offset) * es;
  char* out = static_cast<char*>(dst.data()) + static_cast<size_t>(to.offset) * es;
  MOEPEAK_CUDA_CHECK(cudaMemcpy2DAsync(
      out, static_cast<size_t>(to.pitch) * es, in, static_cast<size_t>(from.pitch) * es,
      static_cast<size_t>(width) * es, static_cast<size_t>(rows), cudaMemcpyDefault,
      static_cast<cudaStream_t>(stream.native_handle())));
}

}  // namespace moepeak::ops
