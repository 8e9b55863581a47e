// gpu_probe.h for a build without the CUDA backend: nothing to probe, said plainly.
#include "topology/gpu_probe.h"

namespace moepeak::topology {

CudaProbe probe_cuda() {
  CudaProbe p;
  p.status = "no GPU: the CUDA backend is not compiled in";
  return p;
}

GpuCopyRates measure_gpu_copies(int, void*, void*, size_t, bool, int) {
  GpuCopyRates r;
  r.error = "the CUDA backend is not compiled in";
  return r;
}

double cuda_register_seconds(void*, size_t) { return -1; }

}  // namespace moepeak::topology
