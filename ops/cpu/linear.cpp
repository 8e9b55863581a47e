// CPU linear: three row-major GEMMs (see ops/linear.h).
//   forward   y (M, N)  = x (M, K) . w^T (K, N)
//   backward  dx (M, K) = dy (M, N) . w (N, K)
//             dw (N, K) += dy^T (N, M) . x (M, K)
// A column block w[:, k0 : k0 + K] of an (N, K_w) w is the same GEMMs with leading dimension K_w.
// f32 and f64 are one OpenBLAS CBLAS sgemm / dgemm each; bf16 storage runs gemm_bf16
// (ops/cpu/gemm_tiles.h: fp32 arithmetic, one rounding per bf16 output), with dw in bf16 or in
// f32 (the fp32 main gradient, accumulated with no bf16 rounding).
#include "ops/linear.h"

#include <cblas.h>

#include <string>
#include <type_traits>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/gemm_tiles.h"

namespace moepeak::ops {
namespace {

// C (rows, cols) = alpha * op(A) op(B) + beta * C, row-major, with op(A) (rows, inner) and
// op(B) (inner, cols). Handles the empty cases BLAS rejects or leaves ambiguous: no output
// elements does nothing; an empty inner dimension leaves beta * C (zeros when beta == 0, so an
// output poisoned with NaN is still overwritten).
template <typename T>
void gemm_blas(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        T& out = c[i * ldc + j];
        out = beta == T(0) ? T(0) : beta * out;
      }
    }
    return;
  }
  CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  auto m = static_cast<blasint>(rows), n = static_cast<blasint>(cols),
       k = static_cast<blasint>(inner);
  auto la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb),
       lc = static_cast<blasint>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, la, b, lb, beta, c, lc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, la, b, lb, beta, c, lc);
  }
}

// The GEMM of storage T into a C of storage TC (TC = T, or f32 for a bf16 T), written or, with
// `accumulate`, added: gemm_blas with beta 0 or 1 for f32 and f64, gemm_bf16 for bf16 (the same
// empty cases).
template <typename T, typename TC>
void gemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const T* a,
          int64_t lda, const T* b, int64_t ldb, bool accumulate, TC* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, bf16>) {
    gemm_bf16(trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate, c, ldc);
  } else {
    static_assert(std::is_same_v<T, TC>);
    gemm_blas<T>(trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate ? T(1) : T(0), c,
                 ldc);
  }
}

// The dtype an output of x's GEMM may have: x's, or f32 beside a bf16 x (an fp32 accumulator).
DType accumulator_dtype(const Tensor& x, const Tensor& out) {
  return x.dtype() == DType::bf16 && out.dtype() == DType::f32 ? DType::f32 : x.dtype();
}

// x: (M, K) float; w: (N, K) of x's dtype, or, for a column block (`block`), (N, K_w) with
// 0 <= k0 and k0 + K <= K_w.
void check_x_and_w(const char* op, const Tensor& x, const Tensor& w, int64_t k0, bool block) {
  MOEPEAK_CHECK(x.ndim() == 2, op, ": x must be (M, K), got ", x.str());
  MOEPEAK_CHECK(w.ndim() == 2 && w.dtype() == x.dtype(), op, ": w must be ", dtype_name(x.dtype()),
                " (N, K) for x ", x.str(), ", got ", w.str());
  if (block) {
    MOEPEAK_CHECK(k0 >= 0 && k0 + x.size(1) <= w.size(1), op, ": columns [", k0, ", ",
                  k0 + x.size(1), ") of w ", w.str(), " for x ", x.str(), " are out of range");
  } else {
    MOEPEAK_CHECK(w.size(1) == x.size(1), op, ": w must be ", dtype_name(x.dtype()), "(N, ",
                  x.size(1), ") for x ", x.str(), ", got ", w.str());
  }
}

// y (M, N) (+)= x (M, K) . w[:, k0 : k0 + K]^T, w (N, K_w).
void forward(const char* op, bool block, const Tensor& x, const Tensor& w, int64_t k0,
             const Tensor& y, bool accumulate, Stream& stream) {
  check_linear_forward_args(op, x, w, k0, block, y);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), kw = w.size(1);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();       // (M, K)
    const T* wp = w.data_as<T>() + k0;  // (N, K) within (N, K_w)
    // y in x's dtype, or an fp32 accumulator of bf16 products (checked above).
    with_accumulator<T>(y.dtype(), [&](auto y_zero) {
      using TY = decltype(y_zero);
      TY* yp = y.data_as<TY>();  // (M, N)
      as_cpu_stream(stream).enqueue(
          [=] { gemm<T, TY>(false, true, m, n, k, xp, k, wp, kw, accumulate, yp, n); });
    });
  });
}

// dx (M, K) (+)= dy (M, N) . w[:, k0 : k0 + K];  dw[:, k0 : k0 + K] += dy^T x, with dx of
// storage TX and dw of storage TW (each T, or f32 for a bf16 T).
template <typename T, typename TX, typename TW>
void enqueue_backward(Stream& stream, const Tensor& x, const Tensor& w, int64_t k0,
                      const Tensor& dy, const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                      const LinearGrads& want) {
  const bool want_dx = want.dx, want_dw = want.dw;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), kw = w.size(1);
  const T* xp = x.data_as<T>();                         // (M, K)
  const T* wp = w.data_as<T>() + k0;                    // (N, K) within (N, K_w)
  const T* dyp = dy.data_as<T>();                       // (M, N)
  TX* dxp = want_dx ? dx.data_as<TX>() : nullptr;       // (M, K)
  TW* dwp = want_dw ? dw.data_as<TW>() + k0 : nullptr;  // (N, K) within (N, K_w)
  as_cpu_stream(stream).enqueue([=] {
    if (want_dx) gemm<T, TX>(false, false, m, k, n, dyp, n, wp, kw, accumulate_dx, dxp, k);
    if (want_dw) gemm<T, TW>(true, false, n, k, m, dyp, n, xp, k, true, dwp, kw);
  });
}

void backward(const char* op, bool block, const Tensor& x, const Tensor& w, int64_t k0,
              const Tensor& dy, const Tensor& dx, bool accumulate_dx, const Tensor& dw,
              Stream& stream) {
  const LinearGrads want = check_linear_backward_args(op, x, w, k0, block, dy, dx, dw);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    // dx and dw each in x's dtype, or an fp32 accumulator beside bf16 (checked above); one not
    // asked for takes x's.
    with_accumulator<T>(want.dx ? dx.dtype() : x.dtype(), [&](auto dx_zero) {
      with_accumulator<T>(want.dw ? dw.dtype() : x.dtype(), [&](auto dw_zero) {
        enqueue_backward<T, decltype(dx_zero), decltype(dw_zero)>(stream, x, w, k0, dy, dx,
                                                                  accumulate_dx, dw, want);
      });
    });
  });
}

}  // namespace

void check_linear_forward_args(const char* op, const Tensor& x, const Tensor& w, int64_t k0,
                               bool cols, const Tensor& y) {
  check_x_and_w(op, x, w, k0, cols);
  y.expect(Shape{x.size(0), w.size(0)}, accumulator_dtype(x, y), std::string(op) + ": y");
}

LinearGrads check_linear_backward_args(const char* op, const Tensor& x, const Tensor& w, int64_t k0,
                                       bool cols, const Tensor& dy, const Tensor& dx,
                                       const Tensor& dw) {
  check_x_and_w(op, x, w, k0, cols);
  dy.expect(Shape{x.size(0), w.size(0)}, x.dtype(), std::string(op) + ": dy");
  // A (0, K) dx, or a dw of a (0, K) w, may have no bytes but is "given".
  LinearGrads want;
  want.dx = dx.defined() || dx.ndim() > 0;
  want.dw = dw.defined() || dw.ndim() > 0;
  if (want.dx) dx.expect(x.shape(), accumulator_dtype(x, dx), std::string(op) + ": dx");
  if (want.dw) dw.expect(w.shape(), accumulator_dtype(x, dw), std::string(op) + ": dw");
  return want;
}

void linear_forward_cpu(const Tensor& x, const Tensor& w, const Tensor& y, bool accumulate,
                        Stream& stream) {
  forward("linear_forward_cpu", false, x, w, 0, y, accumulate, stream);
}

void linear_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                         bool accumulate_dx, const Tensor& dw, Stream& stream) {
  backward("linear_backward_cpu", false, x, w, 0, dy, dx, accumulate_dx, dw, stream);
}

void linear_forward_cols_cpu(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& y,
                             bool accumulate, Stream& stream) {
  forward("linear_forward_cols_cpu", true, x, w, k0, y, accumulate, stream);
}

void linear_backward_cols_cpu(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& dy,
                              const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                              Stream& stream) {
  backward("linear_backward_cols_cpu", true, x, w, k0, dy, dx, accumulate_dx, dw, stream);
}

int set_gemm_algorithm_rank(int rank) {
  MOEPEAK_CHECK(rank >= 0 && rank < kGemmAlgorithmRanks, "GEMM algorithm rank ", rank,
                " is outside [0, ", kGemmAlgorithmRanks - 1, "]");
#ifdef MOEPEAK_WITH_CUDA
  return set_gemm_algorithm_rank_cuda(rank);
#else
  return 0;  // OpenBLAS: one algorithm
#endif
}

}  // namespace moepeak::ops
