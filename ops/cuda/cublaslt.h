// The GEMMs of the CUDA ops through cuBLASLt (ops/linear.h, ops/matmul.h): one row-major
// C = alpha op(A) op(B) + beta C on a stream, with the handle, workspaces and algorithm choices
// this module keeps for the process. Host code (g++ or nvcc); no kernels of its own.
//
//   cuda::gemm(DType::bf16, /*trans_a=*/false, /*trans_b=*/true, M, N, K,
//              1.0, x, K, w, K_w, /*beta=*/0.0, y, N, stream);   // y = x w^T
//
// Storage dtype and math, the same for A, B and C:
//   f32   CUBLAS_COMPUTE_32F: strict fp32 (no TF32; the op tests compare with 1e-5)
//   bf16  bf16 A/B/C, CUBLAS_COMPUTE_32F, fp32 scale: products accumulate in fp32, and beta = 1
//         reads C in bf16 and rounds the sum to bf16 once
//   f64   CUBLAS_COMPUTE_64F (test references); a cuBLASLt without it throws naming the dtype
// and one mixed pair (the overload with c_dtype), the fp32 main gradient of ops/linear.h:
//   bf16 A/B with f32 C/D, CUBLAS_COMPUTE_32F, fp32 scale: products accumulate in fp32, beta = 1
//         reads C in fp32 and the sum is stored in fp32 (no bf16 rounding anywhere)
//
// What the module keeps (created on first use under one mutex, never freed; the process ends
// with them):
// - one cublasLtHandle_t per device (the current device at the call; a rank uses one GPU, so in
//   practice one handle for the process);
// - one workspace of kWorkspaceBytes per (device, cudaStream_t), cudaMalloc'd by the first GEMM
//   on that stream (that call may synchronise the device, as cudaMalloc can). A stream destroyed
//   and another created with the same handle reuse it (CudaStream synchronises before it is
//   destroyed); each distinct stream that ever runs a GEMM keeps 32 MiB. The grouped GEMMs of
//   ops/cuda/grouped_linear.cpp (cuBLAS) use the same workspace on the same stream
//   (stream_workspace below);
// - one plan per GEMM configuration (device, A/B dtype, C/D dtype, transposes, sizes, leading
//   dimensions, and the pointers' alignments): descriptors and the algorithm
//   cublasLtMatmulAlgoGetHeuristic chose, so the heuristic runs once per configuration, not once
//   per call. With the choice fixed per configuration, a GEMM repeats bit for bit run to run on one
//   GPU model and cuBLAS version (cuBLAS's reproducibility guarantee); a different pointer
//   alignment may choose a different algorithm and round differently.
// NOTES: the workspaces are outside the arena, in the plan's `cublas` term
// (core/runtime/outside_arena.h), like cuBLAS's own workspaces: 32 MiB per stream that runs GEMMs,
// and the schedules run theirs on the caller's compute stream (their comm and copy streams run
// none).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/runtime/dtype.h"
#include "core/runtime/outside_arena.h"  // defines: kCublasWorkspaceBytes
#include "core/runtime/tensor.h"

// MOEPEAK_CUBLAS_CHECK(call): turns a cuBLAS(Lt) status other than CUBLAS_STATUS_SUCCESS into
// moepeak::Error with the status's name and text and the call (as MOEPEAK_CUDA_CHECK does for
// the CUDA runtime, core/runtime/cuda_check.h).
#define MOEPEAK_CUBLAS_CHECK(call)                                                        \
  do {                                                                                    \
    cublasStatus_t moepeak_cublas_status_ = (call);                                       \
    if (moepeak_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                \
      MOEPEAK_THROW("cuBLAS error ", cublasLtGetStatusName(moepeak_cublas_status_), " (", \
                    cublasLtGetStatusString(moepeak_cublas_status_), ") in ", #call);     \
    }                                                                                     \
  } while (0)

namespace moepeak::ops::cuda {

// Bytes of each stream's cuBLASLt workspace (the most an algorithm may use): the plan's
// `cublas` term outside the arena counts it per GEMM stream.
constexpr size_t kWorkspaceBytes = kCublasWorkspaceBytes;

// C (rows, cols) = alpha * op(A) (rows, inner) . op(B) (inner, cols) + beta * C, enqueued on
// `stream` (asynchronous). Every matrix is row-major with the given leading dimension (elements
// from one row to the next):
//   A  (rows, inner), lda >= inner   or, with trans_a, stored (inner, rows), lda >= rows
//   B  (inner, cols), ldb >= cols    or, with trans_b, stored (cols, inner), ldb >= inner
//   C  (rows, cols),  ldc >= cols
// Pointers need only the dtype's own alignment (the heuristic is told each pointer's alignment,
// so a column offset k0 of a bf16 matrix still runs). C may not overlap A or B.
// Empty sizes: rows == 0 or cols == 0 does nothing; inner == 0 leaves beta * C, i.e. writes zeros
// when beta == 0 (a cudaMemsetAsync, so a NaN-poisoned C is overwritten) and leaves C when
// beta == 1 (other betas with inner == 0 throw). Throws moepeak::Error on a bad argument, an
// unsupported dtype, or when cuBLASLt has no algorithm for the configuration.
// A and B are `dtype`, C is `c_dtype`: dtype itself, or f32 for a bf16 dtype (the table above;
// any other pair throws naming both).
void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t rows, int64_t cols,
          int64_t inner, double alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
          double beta, void* c, int64_t ldc, cudaStream_t stream);
// The same with C of A's and B's dtype.
inline void gemm(DType dtype, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner,
                 double alpha, const void* a, int64_t lda, const void* b, int64_t ldb, double beta,
                 void* c, int64_t ldc, cudaStream_t stream) {
  gemm(dtype, dtype, trans_a, trans_b, rows, cols, inner, alpha, a, lda, b, ldb, beta, c, ldc,
       stream);
}

// The workspace (kWorkspaceBytes) gemm() uses on `stream` on the current device, cudaMalloc'd by
// the first call for that stream (gemm()'s or this). Other cuBLAS calls enqueued on the same
// stream may use it too (ops/cuda/grouped_linear.cpp hands it to cublasSetWorkspace): stream order
// keeps them apart, and no call keeps anything in it from one call to the next.
void* stream_workspace(cudaStream_t stream);

// The GEMMs from now on (every thread) use the rank-th algorithm of cuBLASLt's heuristic list for
// their configuration (0 = its first choice, what training uses; a rank past the list's end
// takes its last). Returns the previous rank. For `bench gemm`, which times a shape's first
// kMaxAlgorithmRank + 1 candidates through the same path to find the per-shape ceiling; the
// plan cache keeps one plan per (configuration, rank).
constexpr int kMaxAlgorithmRank = 7;
int set_gemm_algorithm_rank(int rank);

// Throws naming `op` unless `dtype` is one gemm() supports (f32, bf16, f64).
void expect_gemm_dtype(const char* op, DType dtype);

// Throws naming `op` and `name` unless `t` has no elements or is device memory of a CUDA backend
// (a host tensor handed to cuBLASLt would fault on the GPU, later and without a name).
void expect_device_operand(const char* op, const Tensor& t, const char* name);

}  // namespace moepeak::ops::cuda
