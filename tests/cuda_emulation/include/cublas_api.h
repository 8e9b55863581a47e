// The cuBLAS types that the emulated cuBLAS (cublas_v2.h) and cuBLASLt (cublasLt.h) share, as the
// real toolkit splits them: status, operation, compute type and math mode, with the toolkit's
// enumerator values. A subset: what moepeak uses (see ../cublas.cpp for the semantics and what
// the emulation does not do).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "library_types.h"

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

// CUBLAS_OP_C on real data is CUBLAS_OP_T (cuBLAS's rule; the emulation has real types only).
typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
  CUBLAS_OP_HERMITAN = 2,
  CUBLAS_OP_CONJG = 3,
} cublasOperation_t;

// The emulation runs CUBLAS_COMPUTE_32F and CUBLAS_COMPUTE_64F (and their _PEDANTIC forms, the
// same math here); the others are declared for completeness and rejected (NOT_SUPPORTED).
typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
} cublasComputeType_t;

// Math modes are accepted and remembered; the emulation's math is the same in all of them
// (strict fp32, never TF32 or reduced-precision reductions).
typedef enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

typedef enum {
  CUBLAS_POINTER_MODE_HOST = 0,
  CUBLAS_POINTER_MODE_DEVICE = 1,
} cublasPointerMode_t;

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
// Binds the handle to `stream` and, as cuBLAS does, drops the workspace set before (the handle
// goes back to its own default workspace).
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
// `workspace` must be 256-byte aligned (cuBLAS's rule); nullptr with size 0 is allowed.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace,
                                  size_t workspaceSizeInBytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);

// For each group g (group_count of them), group_size[g] GEMMs with that group's transposes,
// (m, n, k), alpha, leading dimensions and beta:  C = alpha op(A) op(B) + beta C, column-major.
// The pointer arrays hold one entry per GEMM (sum of group_size) and are device memory, read
// when the GEMMs run on the handle's stream; the other arrays are host memory, read during the
// call. alpha_array / beta_array are float for CUBLAS_COMPUTE_32F, double for CUBLAS_COMPUTE_64F.
cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType);

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);
}
