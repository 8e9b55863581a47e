// The CUDA backend (built when nvcc is found): one cudaMalloc'd region sub-allocated by the
// arena, pinned host pool registered with cudaHostRegister, cudaStream_t / cudaEvent_t wrappers.
// Host code only (compiled by g++); kernels live in ops/cuda/*.cu.
#pragma once

#include <memory>

#include "core/runtime/backend.h"

namespace moepeak {

// Number of usable CUDA devices; 0 when there is no device or no driver (any CUDA error counts
// as "no GPU": without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver).
int cuda_device_count();

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace moepeak
