// CPU matmul: one row-major GEMM, c (M, N) (=|+=) a (M, K) . b (K, N) (see ops/matmul.h):
// OpenBLAS CBLAS sgemm / dgemm for f32 / f64, gemm_bf16 (ops/cpu/gemm_tiles.h) for bf16 storage
// (into a bf16 or an f32 c).
// Test: ctest -R test_ring_dtp_ops; ctest -R test_gemm_bf16
#include "ops/matmul.h"

#include <cblas.h>

#include <string>
#include <type_traits>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/gemm_tiles.h"

namespace moepeak::ops {

void check_matmul_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) {
  MOEPEAK_CHECK(a.ndim() == 2, op, ": a must be (M, K), got ", a.str());
  MOEPEAK_CHECK(b.ndim() == 2 && b.size(0) == a.size(1) && b.dtype() == a.dtype(), op,
                ": b must be ", dtype_name(a.dtype()), "(", a.size(1), ", N) for a ", a.str(),
                ", got ", b.str());
  const bool f32_c = a.dtype() == DType::bf16 && c.dtype() == DType::f32;
  c.expect(Shape{a.size(0), b.size(1)}, f32_c ? DType::f32 : a.dtype(), std::string(op) + ": c");
}

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
                Stream& stream) {
  const char* op = "matmul_cpu";
  check_matmul_args(op, a, b, c);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();  // (M, K)
    const T* bp = b.data_as<T>();  // (K, N)
    if constexpr (std::is_same_v<T, bf16>) {
      if (c.dtype() == DType::f32) {  // the fp32 accumulator of a bf16 product (Ring-DTP's dX)
        float* cp = c.data_as<float>();
        as_cpu_stream(stream).enqueue(
            [=] { gemm_bf16(false, false, m, n, k, ap, k, bp, n, accumulate, cp, n); });
        return;
      }
      bf16* cp = c.data_as<bf16>();
      as_cpu_stream(stream).enqueue(
          [=] { gemm_bf16(false, false, m, n, k, ap, k, bp, n, accumulate, cp, n); });
      return;
    } else {
      T* cp = c.data_as<T>();  // (M, N)
      as_cpu_stream(stream).enqueue([=] {
        if (m == 0 || n == 0) return;
        if (k == 0) {
          if (!accumulate) {
            for (int64_t i = 0; i < m * n; ++i) cp[i] = T(0);
          }
          return;
        }
        const auto bm = static_cast<blasint>(m), bn = static_cast<blasint>(n),
                   bk = static_cast<blasint>(k);
        if constexpr (std::is_same_v<T, float>) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bm, bn, bk, 1.0f, ap, bk, bp, bn,
                      accumulate ? 1.0f : 0.0f, cp, bn);
        } else {
          cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bm, bn, bk, 1.0, ap, bk, bp, bn,
                      accumulate ? 1.0 : 0.0, cp, bn);
        }
      });
    }
  });
}

}  // namespace moepeak::ops
