// What nvcc gives device code, for a .cu file compiled by g++ in the CPU emulation of CUDA:
// the execution-space keywords, the built-in variables (threadIdx, blockIdx, blockDim, gridDim,
// warpSize), __syncthreads and the warp collectives, atomics, the math intrinsics, the vector
// types, static __shared__ arrays (static_shared), and launcher(): what a `<<<...>>>` launch
// becomes. rewrite_cu.cpp puts `#include` of this file at the top of every rewritten .cu file and
// turns the launch syntax and the __shared__ declarations into calls of this header.
//
//   kernel<T><<<grid, block, shared_bytes, stream>>>(a, b);
//     becomes
//   ::moepeak::cuda_emulation::launcher("kernel<T>", kernel<T>, grid, block, shared_bytes,
//                                       stream)(a, b);
//
//   __shared__ double scratch[32];
//     becomes
//   auto& scratch = ::moepeak::cuda_emulation::static_shared<double[32]>(<a per-site key>);
#pragma once

#include <cuda_runtime_api.h>
#include <math.h>  // defines: isnan, isinf, ... in the global namespace, as device code has them

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tests/cuda_emulation/device_threads.h"
#include "tests/cuda_emulation/vector_types.h"

// ---- keywords ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __CUDACC_EMULATED__ 1

// ---- built-in variables -----------------------------------------------------------------------
#define threadIdx (::moepeak::cuda_emulation::thread_index())
#define blockIdx (::moepeak::cuda_emulation::block_index())
#define blockDim (::moepeak::cuda_emulation::block_dim())
#define gridDim (::moepeak::cuda_emulation::grid_dim())
constexpr int warpSize = 32;

// ---- barriers and warp collectives -------------------------------------------------------------
inline void __syncthreads() { ::moepeak::cuda_emulation::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::moepeak::cuda_emulation::sync_warp(mask); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::moepeak::cuda_emulation::ballot(mask, predicate != 0);
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return (__ballot_sync(mask, predicate) & mask) == (__ballot_sync(mask, 1) & mask);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  return ::moepeak::cuda_emulation::shfl_xor(mask, value, lane_mask, width);
}

// ---- atomics (one block's fibers never run at once; the builtins keep them atomic anyway) -----
template <typename T>
inline T moepeak_emulated_atomic_update(T* address, T (*update)(T, T), T value) {
  T old = __atomic_load_n(address, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(address, &old, update(old, value), false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T>
inline T atomicAdd(T* address, T value) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
  } else {
    // Floating point: compare-and-swap on the bits.
    using Bits = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned>;
    Bits* bits = reinterpret_cast<Bits*>(address);
    Bits old = __atomic_load_n(bits, __ATOMIC_SEQ_CST), next;
    T old_value;
    do {
      std::memcpy(&old_value, &old, sizeof(T));
      const T sum = old_value + value;
      std::memcpy(&next, &sum, sizeof(T));
    } while (
        !__atomic_compare_exchange_n(bits, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old_value;
  }
}
template <typename T>
inline T atomicSub(T* address, T value) {
  return __atomic_fetch_sub(address, value, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicMax(T* address, T value) {
  return moepeak_emulated_atomic_update<T>(
      address, [](T a, T b) { return a > b ? a : b; }, value);
}
template <typename T>
inline T atomicMin(T* address, T value) {
  return moepeak_emulated_atomic_update<T>(
      address, [](T a, T b) { return a < b ? a : b; }, value);
}
template <typename T>
inline T atomicExch(T* address, T value) {
  return __atomic_exchange_n(address, value, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicCAS(T* address, T compare, T value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}

// ---- math intrinsics (the fast forms compute the accurate ones: tolerances hold either way) ---
// The round-to-nearest operations nvcc never contracts into an FMA; g++ for x86-64 contracts
// nothing without -mfma, so plain operators are the same.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline int __float_as_int(float f) {
  int v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline unsigned __float_as_uint(float f) {
  unsigned v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline double __longlong_as_double(long long v) {
  double d;
  std::memcpy(&d, &v, sizeof d);
  return d;
}
inline long long __double_as_longlong(double d) {
  long long v;
  std::memcpy(&v, &d, sizeof v);
  return v;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }

namespace moepeak::cuda_emulation {

// ---- static __shared__ ------------------------------------------------------------------------
// The block's copy of the static shared array declared at `site` (one key per declaration and
// template instantiation): the first thread of the block to reach it gets fresh storage filled
// with NaN bytes (0xff), every other thread of that block the same storage.
template <typename Array>
Array& static_shared(const void* site) {
  static_assert(std::is_trivially_destructible_v<std::remove_all_extents_t<Array>>);
  return *static_cast<Array*>(static_shared_bytes(site, sizeof(Array), alignof(Array)));
}
// The same for the emulation's own block-shared scratch (emulation_scratch_bytes): not counted
// against the kernel's shared memory, which the hardware does not spend on it.
template <typename Array>
Array& emulation_scratch(const void* site) {
  static_assert(std::is_trivially_destructible_v<std::remove_all_extents_t<Array>>);
  return *static_cast<Array*>(emulation_scratch_bytes(site, sizeof(Array), alignof(Array)));
}

// ---- kernel coverage ------------------------------------------------------------------------
// Records that the kernel `name` ran (rewrite_cu puts a call first in every __global__ body);
// with MOEPEAK_CUDA_EMULATION_KERNEL_LOG=FILE the process appends the names it saw to FILE at
// exit, one per line. Returns true.
bool note_kernel(const char* name);

// ---- launches ---------------------------------------------------------------------------------
// Checks the configuration as the CUDA runtime does (an invalid one is the error
// cudaGetLastError reports, and nothing runs) and queues on `stream` one run of `body` per
// thread of the grid (device_threads.h).
void launch_kernel(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> body);

template <typename... Params>
class Launch {
 public:
  Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
         cudaStream_t stream)
      : name_(name),
        kernel_(kernel),
        grid_(grid),
        block_(block),
        shared_(shared_bytes),
        stream_(stream) {}

  // The arguments are converted to the kernel's parameter types and copied now, as CUDA copies
  // them at the launch; every thread gets its own copy of them.
  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "a kernel launch with the wrong arity");
    auto params = std::make_shared<const std::tuple<std::decay_t<Params>...>>(
        std::decay_t<Params>(std::forward<Args>(args))...);
    void (*kernel)(Params...) = kernel_;
    launch_kernel(name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_, stream_,
                  [kernel, params] {
                    std::tuple<std::decay_t<Params>...> mine = *params;
                    std::apply(kernel, std::move(mine));
                  });
  }

 private:
  const char* name_;
  void (*kernel_)(Params...);
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};

template <typename... Params>
Launch<Params...> launcher(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                           size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  return Launch<Params...>(name, kernel, grid, block, shared_bytes, stream);
}

}  // namespace moepeak::cuda_emulation
