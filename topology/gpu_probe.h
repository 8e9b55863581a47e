// The CUDA side of `moepeak probe`, behind a plain C++ interface so that callers need no CUDA
// headers: gpu_probe_cuda.cpp implements it with the CUDA runtime and NCCL (built only with
// MOEPEAK_WITH_CUDA), gpu_probe_none.cpp answers "not compiled in" otherwise.
//
// Every CUDA error while probing means "no GPU" (PLATFORM.md: without a driver
// cudaGetDeviceCount returns error 35, not cudaErrorNoDevice); the reason goes into `status`.
// Tested through test_topology (this machine) and, on a GPU machine, `moepeak probe`.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "topology/node_topology.h"

namespace moepeak::topology {

struct CudaProbe {
  bool compiled = false;              // this build has the CUDA backend
  std::string status;                 // "2 CUDA devices", "no GPU: cudaGetDeviceCount: ..."
  std::string driver, runtime, nccl;  // versions ("13.0", "2.28.9"); "" when unknown
  std::vector<GpuInfo> gpus;          // numa_node and nvlinks are filled in by the caller
  std::vector<GpuLinkInfo> links;     // every pair a < b; nvlinks filled in by the caller
};

// Never throws: failures are reported in `status` with an empty device list.
CudaProbe probe_cuda();

// Copy rates between host memory and one device, GB/s (1e9 bytes/s); 0 when a copy failed.
struct GpuCopyRates {
  double h2d = 0, d2h = 0, bidir = 0;  // bidir: bytes moved both ways together / elapsed
  std::string error;                   // the CUDA error that stopped it, "" on success
};
// Copies `bytes` from host_src to the device and from the device to host_dst, `iters` times each
// after one warm-up, then both directions at once on two streams. When `pin` is set the two host
// buffers are registered (cudaHostRegister) for the measurement and unregistered after; else they
// are pageable. Never throws.
GpuCopyRates measure_gpu_copies(int device, void* host_src, void* host_dst, size_t bytes, bool pin,
                                int iters);

// Seconds cudaHostRegister takes for `bytes` at `ptr` (unregistered again after); < 0 on error.
double cuda_register_seconds(void* ptr, size_t bytes);

}  // namespace moepeak::topology
