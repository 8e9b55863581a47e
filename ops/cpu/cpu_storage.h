// Storage types of the CPU kernels (ops/cpu/*.cpp): f32 and f64 as before, and bf16 storage with
// fp32 arithmetic, the GPU path's byte layout (docs/design.md, "bf16 on the CPU").
//
//   dispatch_storage(dtype, op, f)   calls f(float{}), f(double{}) or f(bf16{}) for the dtype
//   compute_t<T>                     the arithmetic type: float for f32 and bf16, double for f64
//   load(p[i]) / store(p + i, v)     one element between storage and compute type; a bf16 store
//                                    rounds to nearest even (bf16(float), core/runtime/dtype.h)
//   widen(src, dst, n)               n storage elements -> compute type (exact)
//   narrow(src, dst, n)              n compute-type values -> storage (one rounding each)
//   with_accumulator<T>(dtype, f)    f(float{}) for an f32 output beside bf16 T, else f(T{})
//
// NOTES: a kernel with bf16 storage reads each element once into fp32, does the CPU f32 kernel's
// arithmetic, and rounds every output element to bf16 once, at the end, as the CUDA kernels do
// (ops/*.h state it per op). Whole live sets are never widened: a kernel converts a row or a
// fixed-size tile at a time into scratch of a fixed size (ops/op_common.h's convention).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "core/runtime/dtype.h"

namespace moepeak::ops {

template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

template <typename T>
inline void store(T* p, compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) {
    *p = bf16(v);
  } else {
    *p = v;
  }
}

// The value `v` takes when stored in T and read back (a bf16 rounding; identity otherwise).
template <typename T>
inline compute_t<T> round_to_storage(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<float>(bf16(v));
  } else {
    return v;
  }
}

template <typename T>
inline void widen(const T* src, compute_t<T>* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

template <typename T>
inline void narrow(const compute_t<T>* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store(dst + i, src[i]);
}

// Calls f(float{}) when `acc` (an output's dtype) is an f32 accumulator beside bf16 storage T
// (the fp32 main gradients and sums of a bf16 run), else f(T{}): the output type of a kernel whose
// output may be wider than its inputs. The op's argument checks have admitted only those two.
// The CUDA kernels' twin: ops/cuda/cuda_common.cuh.
template <typename T, typename F>
void with_accumulator(DType acc, F&& f) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (acc == DType::f32) {
      f(float{});
      return;
    }
  }
  f(T{});
}

// Calls f(float{}), f(double{}) or f(bf16{}) for the tensor's storage dtype.
template <typename F>
decltype(auto) dispatch_storage(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    default:
      break;
  }
  MOEPEAK_THROW("op ", op, " on the CPU supports f32, bf16 and f64, got ", dtype_name(dtype));
}

}  // namespace moepeak::ops
