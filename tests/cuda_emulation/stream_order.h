// Stream order in the CPU emulation of CUDA: what the emulated libraries (cuBLAS, cuBLASLt, NCCL)
// use to put their work on a cudaStream_t, exactly where a kernel launch or an async copy would
// go (see runtime.cpp for when queued work runs).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>

namespace moepeak::cuda_emulation {

// Queues `work` on `stream` (nullptr: the legacy default stream). It runs on the calling host
// thread, after everything queued on that stream before it, when something waits for the stream
// (a synchronize, an event, a blocking copy). A moepeak::Error or std::exception that `work`
// throws becomes the sticky error cudaErrorLaunchFailure, its message printed to stderr with
// `what` (e.g. "cublasLtMatmul") in front. Returns cudaErrorInvalidResourceHandle for a stream
// that was never created or is destroyed.
cudaError_t enqueue(cudaStream_t stream, std::string what, std::function<void()> work);

// Runs everything queued on every stream (cudaDeviceSynchronize without its error report).
void drain_all_streams();

// Whether `ptr` points into memory from cudaMalloc (the emulated device memory).
bool is_device_pointer(const void* ptr);

}  // namespace moepeak::cuda_emulation
