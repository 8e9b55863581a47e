// CUDA's library data types (cudaDataType), with the toolkit's values, for the emulated cuBLAS and
// cuBLASLt (see cuda_runtime_api.h).
#pragma once

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
} cudaDataType;
