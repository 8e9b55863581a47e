// CUDA fill: writes the element pattern computed on the host (fill_pattern), so both backends
// produce identical bits for every dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/runtime/cuda_check.h"
#include "ops/fill.h"

namespace moepeak::ops {
namespace {

template <typename Word>
__global__ void fill_kernel(Word* out, int64_t n, Word value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

template <typename Word>
void launch(void* out, int64_t n, uint64_t pattern, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  fill_kernel<Word><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<Word*>(out), n, static_cast<Word>(pattern));
  MOEPEAK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fill_cuda(const Tensor& out, double value, Stream& stream) {
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  uint64_t pattern = fill_pattern(out.dtype(), value);
  if (pattern == 0) {  // zeros (gradients every step): the driver's memset, not a kernel
    if (out.numel() > 0) MOEPEAK_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), s));
    return;
  }
  switch (dtype_size(out.dtype())) {
    case 2:
      launch<uint16_t>(out.data(), out.numel(), pattern, s);
      break;
    case 4:
      launch<uint32_t>(out.data(), out.numel(), pattern, s);
      break;
    case 8:
      launch<uint64_t>(out.data(), out.numel(), pattern, s);
      break;
    default:
      MOEPEAK_THROW("fill_cuda: unsupported dtype ", dtype_name(out.dtype()));
  }
}

}  // namespace moepeak::ops
