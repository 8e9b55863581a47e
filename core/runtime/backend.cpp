// Backend::create: picks the CPU or CUDA implementation.
#include "core/runtime/backend.h"

#include "core/error.h"
#include "core/runtime/cpu_backend.h"
#ifdef MOEPEAK_WITH_CUDA
#include "core/runtime/cuda_backend.h"
#endif

namespace moepeak {

std::string_view backend_kind_name(BackendKind kind) {
  return kind == BackendKind::cpu ? "cpu" : "cuda";
}

std::unique_ptr<Backend> Backend::create(const BackendOptions& options) {
  if (options.kind == BackendKind::cpu) return std::make_unique<CpuBackend>(options);
#ifdef MOEPEAK_WITH_CUDA
  return make_cuda_backend(options);
#else
  MOEPEAK_THROW("this moepeak was built without the CUDA backend (configure with "
                "-DMOEPEAK_CUDA=ON and a CUDA toolkit), so runtime.backend = \"cuda\" cannot run");
#endif
}

bool Backend::cuda_available() {
#ifdef MOEPEAK_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moepeak
