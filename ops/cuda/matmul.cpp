// CUDA matmul: one row-major GEMM through cuBLASLt (ops/cuda/cublaslt.h),
// c (M, N) (=|+=) a (M, K) . b (K, N), on f32, bf16 or f64 storage (see ops/matmul.h).
// K == 0 is a cudaMemsetAsync of c (or nothing with accumulate); M == 0 or N == 0 does nothing.
// Host code only (compiled by the C++ compiler; the GEMM is cuBLASLt's).
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_matmul.cpp).
#include "ops/matmul.h"

#include "ops/cuda/cublaslt.h"

namespace moepeak::ops {

void matmul_cuda(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
                 Stream& stream) {
  const char* op = "matmul_cuda";
  check_matmul_args(op, a, b, c);
  cuda::expect_gemm_dtype(op, a.dtype());
  cuda::expect_device_operand(op, a, "a");
  cuda::expect_device_operand(op, b, "b");
  cuda::expect_device_operand(op, c, "c");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  // k == 0: cuda::gemm writes zeros (beta 0) or leaves c (beta 1) without calling cuBLASLt.
  // c's dtype: a's, or f32 for a bf16 a (checked above): bf16 A/B, f32 C/D, fp32 compute.
  cuda::gemm(a.dtype(), c.dtype(), false, false, m, n, k, 1.0, a.data(), k, b.data(), n,
             accumulate ? 1.0 : 0.0, c.data(), n,
             static_cast<cudaStream_t>(stream.native_handle()));
}

}  // namespace moepeak::ops
