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

std::vector<char> copy_to_host(const Tensor& t, Backend& backend, Stream& stream) {
  std::vector<char> host(t.nbytes());
  backend.copy_async(host.data(), t.data(), host.size(), CopyKind::device_to_host, stream);
  stream.synchronize();
  return host;
}

std::vector<double> copy_to_host_as_double(const Tensor& t, Backend& backend, Stream& stream) {
  MOEPEAK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                "copy_to_host_as_double: f32 or f64 tensor expected, got ", t.str());
  std::vector<char> raw = copy_to_host(t, backend, stream);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.dtype() == DType::f64 ? reinterpret_cast<const double*>(raw.data())[i]
                                     : static_cast<double>(reinterpret_cast<const float*>(raw.data())[i]);
  }
  return out;
}

bool Backend::cuda_available() {
#ifdef MOEPEAK_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moepeak
