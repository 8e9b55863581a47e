// CUDA linear: the three row-major GEMMs of ops/cpu/linear.cpp through cuBLASLt
// (ops/cuda/cublaslt.h), on f32, bf16 or f64 storage (see ops/linear.h):
//   forward   y (M, N)  (+)= x (M, K) . w^T (K, N)
//   backward  dx (M, K) (+)= dy (M, N) . w (N, K)
//             dw (N, K)  += dy^T (N, M) . x (M, K)
// With bf16 x and an f32 dw (the fp32 main gradient), the dw GEMM is cuBLASLt's bf16 A/B with
// f32 C/D, CUBLAS_COMPUTE_32F and beta = 1: the products accumulate in fp32 and are added to the
// f32 dw in fp32, with no bf16 rounding; an f32 y or dx (an fp32 accumulator over several calls,
// PipelinedLLEP's F blocks) is the same GEMM form.
// A column block w[:, k0 : k0 + K] of an (N, K_w) w is the same GEMMs on w + k0 with leading
// dimension K_w. Host code only (compiled by the C++ compiler; the GEMMs are cuBLASLt's).
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_linear.cpp).
#include "ops/linear.h"

#include "ops/cuda/cublaslt.h"

namespace moepeak::ops {
namespace {

cudaStream_t native(Stream& stream) { return static_cast<cudaStream_t>(stream.native_handle()); }

// Element `offset` of a tensor's storage (the column k0 of row 0 of a column block).
const void* element(const Tensor& t, int64_t offset) {
  return static_cast<const char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}
void* element_mut(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

// y (M, N) (+)= x (M, K) . w[:, k0 : k0 + K]^T, w (N, K_w).
void forward(const char* op, bool cols, const Tensor& x, const Tensor& w, int64_t k0,
             const Tensor& y, bool accumulate, Stream& stream) {
  check_linear_forward_args(op, x, w, k0, cols, y);
  cuda::expect_gemm_dtype(op, x.dtype());
  cuda::expect_device_operand(op, x, "x");
  cuda::expect_device_operand(op, w, "w");
  cuda::expect_device_operand(op, y, "y");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), kw = w.size(1);
  if (m == 0 || n == 0) return;
  // y's dtype: x's, or f32 for a bf16 x (checked above), as dx's and dw's below.
  cuda::gemm(x.dtype(), y.dtype(), false, true, m, n, k, 1.0, x.data(), k, element(w, k0), kw,
             accumulate ? 1.0 : 0.0, y.data(), n, native(stream));
}

// dx (M, K) (+)= dy (M, N) . w[:, k0 : k0 + K];  dw[:, k0 : k0 + K] += dy^T x.
void backward(const char* op, bool cols, const Tensor& x, const Tensor& w, int64_t k0,
              const Tensor& dy, const Tensor& dx, bool accumulate_dx, const Tensor& dw,
              Stream& stream) {
  const LinearGrads want = check_linear_backward_args(op, x, w, k0, cols, dy, dx, dw);
  cuda::expect_gemm_dtype(op, x.dtype());
  cuda::expect_device_operand(op, x, "x");
  cuda::expect_device_operand(op, w, "w");
  cuda::expect_device_operand(op, dy, "dy");
  if (want.dx) cuda::expect_device_operand(op, dx, "dx");
  if (want.dw) cuda::expect_device_operand(op, dw, "dw");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), kw = w.size(1);
  // No rows (M == 0) or no columns (K == 0) leave nothing to form: dx is empty, dw += 0.
  if (m == 0 || k == 0) return;
  const DType dtype = x.dtype();
  if (want.dx) {
    cuda::gemm(dtype, dx.dtype(), false, false, m, k, n, 1.0, dy.data(), n, element(w, k0), kw,
               accumulate_dx ? 1.0 : 0.0, dx.data(), k, native(stream));
  }
  if (want.dw && n > 0) {
    // dw's dtype: x's, or f32 for a bf16 x (checked above).
    cuda::gemm(dtype, dw.dtype(), true, false, n, k, m, 1.0, dy.data(), n, x.data(), k, 1.0,
               element_mut(dw, k0), kw, native(stream));
  }
}

}  // namespace

void linear_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& y, bool accumulate,
                         Stream& stream) {
  forward("linear_forward_cuda", false, x, w, 0, y, accumulate, stream);
}

void linear_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                          bool accumulate_dx, const Tensor& dw, Stream& stream) {
  backward("linear_backward_cuda", false, x, w, 0, dy, dx, accumulate_dx, dw, stream);
}

void linear_forward_cols_cuda(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& y,
                              bool accumulate, Stream& stream) {
  forward("linear_forward_cols_cuda", true, x, w, k0, y, accumulate, stream);
}

void linear_backward_cols_cuda(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& dy,
                               const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                               Stream& stream) {
  backward("linear_backward_cols_cuda", true, x, w, k0, dy, dx, accumulate_dx, dw, stream);
}

int set_gemm_algorithm_rank_cuda(int rank) {
  static_assert(kGemmAlgorithmRanks == cuda::kMaxAlgorithmRank + 1);
  return cuda::set_gemm_algorithm_rank(rank);
}

}  // namespace moepeak::ops
