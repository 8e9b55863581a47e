// MOEPEAK_CUDA_CHECK(call): turns a CUDA runtime error into moepeak::Error with the error's name
// and text, the call, and the host/rank/file:line prefix. Usable from .cpp and .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

#define MOEPEAK_CUDA_CHECK(call)                                                 \
  do {                                                                           \
    cudaError_t moepeak_cuda_status_ = (call);                                   \
    if (moepeak_cuda_status_ != cudaSuccess) {                                   \
      MOEPEAK_THROW("CUDA error ", cudaGetErrorName(moepeak_cuda_status_), " (", \
                    cudaGetErrorString(moepeak_cuda_status_), ") in ", #call);   \
    }                                                                            \
  } while (0)
