// cuBLASLt as the CPU emulation of CUDA provides it: the descriptors, the heuristic and the
// matmul moepeak calls (ops/cuda/cublaslt.cpp), with cuBLASLt's names, values and signatures.
// A subset: column-major layouts without batches, host pointer mode, no epilogues; see
// ../cublas.cpp for the semantics and what the emulation does not do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cublas_api.h"
#include "library_types.h"

struct cublasLtContext;
typedef struct cublasLtContext* cublasLtHandle_t;

// Opaque here (defined in cublas.cpp); the real toolkit exposes fixed-size byte blobs.
struct cublasLtMatmulDescOpaque_t;
struct cublasLtMatrixLayoutOpaque_t;
struct cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

// An algorithm as the heuristic returns it (the real layout: 8 words the library interprets).
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;  // bytes the algorithm needs (0 in the emulation)
  cublasStatus_t state;  // CUBLAS_STATUS_SUCCESS for a usable result
  float wavesCount;      // 1 in the emulation
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// Matmul descriptor attributes (types of the values in comments). The emulation sets TRANSA,
// TRANSB, SCALE_TYPE and (to its only values) POINTER_MODE, EPILOGUE and TRANSC; the rest return
// CUBLAS_STATUS_NOT_SUPPORTED.
typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,  // int32_t, cublasComputeType_t
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,    // int32_t, cudaDataType_t
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,  // int32_t, cublasLtPointerMode_t
  CUBLASLT_MATMUL_DESC_TRANSA = 3,        // int32_t, cublasOperation_t
  CUBLASLT_MATMUL_DESC_TRANSB = 4,        // int32_t, cublasOperation_t
  CUBLASLT_MATMUL_DESC_TRANSC = 5,        // int32_t, cublasOperation_t (only CUBLAS_OP_N)
  CUBLASLT_MATMUL_DESC_FILL_MODE = 6,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,  // uint32_t, cublasLtEpilogue_t
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_POINTER_MODE_HOST = 0,
  CUBLASLT_POINTER_MODE_DEVICE = 1,
} cublasLtPointerMode_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
} cublasLtEpilogue_t;

// Preference attributes (value types in comments); all are accepted, the emulation uses the
// MIN_ALIGNMENT ones (default 256 bytes, cuBLASLt's assumption when not told).
typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,        // float
  CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,             // uint64_t
} cublasLtMatmulPreferenceAttributes_t;

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes);

// A column-major (rows, cols) matrix of `type` with leading dimension ld >= rows.
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes);

// One result (returnAlgoCount 1) for a configuration the emulation runs; NOT_SUPPORTED and no
// result for a type combination it does not; INVALID_VALUE for inconsistent descriptors.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);

// D = alpha op(A) op(B) + beta C on `stream` (asynchronous); C and D may be the same memory
// (then Cdesc and Ddesc must describe the same layout). algo: nullptr or a heuristic result.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);
}
