// What every CUDA op file shares: the stream handle of a Stream, element loads and stores that
// compute in fp32 whatever the storage (bf16 storage, fp32 accumulation; f32 storage where the
// CPU reference is compared exactly), a dispatch over the storage dtypes, grid sizing, and block
// reductions. Device code only in .cu files (nvcc, C++17); no toml++ or spdlog here.
//
//   storage dtypes of float tensors on the GPU: f32 (float), bf16 (__nv_bfloat16);
//   f64 only where an op's header says so (the cross-entropy fold state, test references).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/runtime/cuda_check.h"
#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace moepeak::ops::cuda {

inline cudaStream_t native(Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

// ---- element access: load to fp32 (or f64), store rounding to the storage type ---------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(double v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ double from_f32<double>(float v) {
  return v;
}

// The math type of a storage type: fp32 for f32 and bf16, f64 for f64.
template <typename T>
struct compute_type {
  using type = float;
};
template <>
struct compute_type<double> {
  using type = double;
};
template <typename T>
using compute_t = typename compute_type<T>::type;

template <typename C, typename T>
__device__ __forceinline__ C load_as(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<C>(__bfloat162float(p[i]));
  } else {
    return static_cast<C>(p[i]);
  }
}
template <typename T, typename C>
__device__ __forceinline__ void store_from(T* p, int64_t i, C v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    p[i] = __float2bfloat16_rn(static_cast<float>(v));
  } else {
    p[i] = static_cast<T>(v);
  }
}

// Calls f(float{}) for f32, f(__nv_bfloat16{}) for bf16, f(double{}) for f64 (when allow_f64).
// Throws naming the op for any other dtype.
template <typename F>
void dispatch_storage(DType dtype, const char* op, F&& f, bool allow_f64 = true) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    case DType::f64:
      if (allow_f64) {
        f(double{});
        return;
      }
      break;
    default:
      break;
  }
  MOEPEAK_THROW("op ", op, " on CUDA supports f32 and bf16", allow_f64 ? " (and f64)" : "",
                ", got ", dtype_name(dtype));
}

// Calls launch(float{}) when `acc` (an output's dtype) is an fp32 accumulator beside bf16
// storage T (the fp32 main gradients and sums of a bf16 run), else launch(T{}): the output type
// of a kernel whose output may be wider than its inputs. The op's argument checks have admitted
// only those two. The CPU kernels' twin: ops/cpu/cpu_storage.h.
template <typename T, typename F>
void with_accumulator(DType acc, F&& launch) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (acc == DType::f32) {
      launch(float{});
      return;
    }
  }
  launch(T{});
}

// ---- launch geometry ----------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int64_t kMaxGridBlocks = 65535ll * 8;

// Blocks for a grid-stride loop over n elements with kThreads threads each.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGridBlocks) blocks = kMaxGridBlocks;
  return static_cast<unsigned>(blocks);
}

// Lets `kernel` use `bytes` of dynamic shared memory when that is over the default 48 KiB;
// throws naming the op and `what` (the shapes) when the device cannot give that much.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes, const char* op, const std::string& what) {
  if (bytes <= 48 * 1024) return;
  int device = 0, optin = 0;
  MOEPEAK_CUDA_CHECK(cudaGetDevice(&device));
  MOEPEAK_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<size_t>(optin))
    MOEPEAK_THROW(op, ": ", what, " needs ", bytes, " bytes of shared memory per block, the",
                  " device allows ", optin);
  MOEPEAK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

// Threads of a block that walks one row of `cols` elements: a multiple of 32 in [32, kThreads].
inline int row_threads(int64_t cols) {
  const int64_t t = (cols + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t > kThreads ? kThreads : t);
}
// The same for rows long enough to want more threads (a vocabulary row): up to 1024.
constexpr int kMaxRowThreads = 1024;
inline int long_row_threads(int64_t cols) {
  if (cols >= 32768) return kMaxRowThreads;
  if (cols >= 8192) return 512;
  return row_threads(cols);
}
// Blocks for one block per row (at least 1, at most the grid limit).
inline unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : rows > kMaxGridBlocks ? kMaxGridBlocks : rows);
}

// After a launch: a bad configuration is an Error at the call, like a CPU op's argument check.
#define MOEPEAK_CUDA_LAUNCH_CHECK() MOEPEAK_CUDA_CHECK(cudaGetLastError())

#define MOEPEAK_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- reductions ---------------------------------------------------------------------------------
template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <typename C>
__device__ __forceinline__ C warp_max(C v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    C o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` is shared memory of at least 32 elements. Safe to call repeatedly (it syncs first).
template <typename C>
__device__ C block_sum(C v, C* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  C total = lane < warps ? scratch[lane] : C(0);
  return warp_sum(total);
}
template <typename C>
__device__ C block_max(C v, C* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  C m = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(m);
}

}  // namespace moepeak::ops::cuda
