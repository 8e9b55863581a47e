// Backend::create: picks the CPU or CUDA implementation.
#include "core/runtime/backend.h"

#include <cstring>

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
  MOEPEAK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::bf16,
                "copy_to_host_as_double: f32, bf16 or f64 tensor expected, got ", t.str());
  std::vector<char> raw = copy_to_host(t, backend, stream);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    const char* at = raw.data() + i * dtype_size(t.dtype());
    switch (t.dtype()) {
      case DType::f64: std::memcpy(&out[i], at, 8); break;
      case DType::f32: { float v; std::memcpy(&v, at, 4); out[i] = v; break; }
      default: { uint16_t v; std::memcpy(&v, at, 2); out[i] = bf16::to_float(v); break; }
    }
  }
  return out;
}

void copy_from_host_as(const std::vector<double>& values, const Tensor& t, Backend& backend,
                       Stream& stream) {
  MOEPEAK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::bf16,
                "copy_from_host_as: f32, bf16 or f64 tensor expected, got ", t.str());
  MOEPEAK_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "copy_from_host_as: ",
                values.size(), " values for ", t.str());
  std::vector<char> raw(t.nbytes());
  for (size_t i = 0; i < values.size(); ++i) {
    char* at = raw.data() + i * dtype_size(t.dtype());
    switch (t.dtype()) {
      case DType::f64: std::memcpy(at, &values[i], 8); break;
      case DType::f32: { float v = static_cast<float>(values[i]); std::memcpy(at, &v, 4); break; }
      default: { uint16_t v = bf16::from_float(static_cast<float>(values[i])); std::memcpy(at, &v, 2); break; }
    }
  }
  backend.copy_async(t.data(), raw.data(), raw.size(), CopyKind::host_to_device, stream);
  stream.synchronize();  // `raw` dies on return
}

bool Backend::cuda_available() {
#ifdef MOEPEAK_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moepeak
