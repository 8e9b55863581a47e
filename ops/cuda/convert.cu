// CUDA convert: one grid-stride kernel per (in, out) dtype pair; bf16 rounding with
// __float2bfloat16_rn (nearest even), matching the CPU's bf16 type.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/runtime/cuda_check.h"
#include "ops/convert.h"

namespace moepeak::ops {
namespace {

__device__ inline double load(const float* p, int64_t i) { return p[i]; }
__device__ inline double load(const double* p, int64_t i) { return p[i]; }
__device__ inline double load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, int64_t i, double v) { p[i] = static_cast<float>(v); }
__device__ inline void store(double* p, int64_t i, double v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, double v) {
  p[i] = __float2bfloat16_rn(static_cast<float>(v));
}

template <typename In, typename Out>
__global__ void convert_kernel(const In* in, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(out, i, load(in, i));
  }
}

template <typename In, typename Out>
void launch(const void* in, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  convert_kernel<In, Out><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const In*>(in), static_cast<Out*>(out), n);
  MOEPEAK_CUDA_CHECK(cudaGetLastError());
}

template <typename In>
void launch_from(const void* in, void* out, DType out_type, int64_t n, cudaStream_t s) {
  switch (out_type) {
    case DType::f32:
      return launch<In, float>(in, out, n, s);
    case DType::bf16:
      return launch<In, __nv_bfloat16>(in, out, n, s);
    case DType::f64:
      return launch<In, double>(in, out, n, s);
    default:
      break;
  }
}

}  // namespace

void convert_cuda(const Tensor& in, const Tensor& out, Stream& stream) {
  check_convert_args(in, out);
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  switch (in.dtype()) {
    case DType::f32:
      return launch_from<float>(in.data(), out.data(), out.dtype(), in.numel(), s);
    case DType::bf16:
      return launch_from<__nv_bfloat16>(in.data(), out.data(), out.dtype(), in.numel(), s);
    case DType::f64:
      return launch_from<double>(in.data(), out.data(), out.dtype(), in.numel(), s);
    default:
      break;
  }
}

}  // namespace moepeak::ops
