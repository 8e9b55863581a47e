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
  MOEPEAK_THROW(
      "this moepeak was built without the CUDA backend (configure with "
      "-DMOEPEAK_CUDA=ON and a CUDA toolkit), so runtime.backend = \"cuda\" cannot run");
#endif
}

std::vector<char> copy_to_host(const Tensor& t, Backend& backend, Stream& stream) {
  std::vector<char> host(t.nbytes());
  backend.copy_async(
      host.data(), t.data(), host.size(),
      t.placement() == Placement::host ? CopyKind::host_to_host : CopyKind::device_to_host, stream);
  stream.synchronize();
  return host;
}

namespace {

// One element of dtype `t` at `at` as a double (integers exactly up to 2^53), and back (floats
// rounded to the dtype, bf16 to nearest even; integers truncated toward zero).
double element_as_double(DType t, const char* at) {
  switch (t) {
    case DType::f64: {
      double v;
      std::memcpy(&v, at, 8);
      return v;
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, at, 4);
      return v;
    }
    case DType::bf16: {
      uint16_t v;
      std::memcpy(&v, at, 2);
      return bf16::to_float(v);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, at, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, at, 8);
      return static_cast<double>(v);
    }
  }
  return 0;
}
void store_element(DType t, double value, char* at) {
  switch (t) {
    case DType::f64:
      std::memcpy(at, &value, 8);
      break;
    case DType::f32: {
      float v = static_cast<float>(value);
      std::memcpy(at, &v, 4);
      break;
    }
    case DType::bf16: {
      uint16_t v = bf16::from_float(static_cast<float>(value));
      std::memcpy(at, &v, 2);
      break;
    }
    case DType::i32: {
      int32_t v = static_cast<int32_t>(value);
      std::memcpy(at, &v, 4);
      break;
    }
    case DType::i64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(at, &v, 8);
      break;
    }
  }
}

}  // namespace

std::vector<double> copy_to_host_as_double(const Tensor& t, Backend& backend, Stream& stream) {
  std::vector<char> raw = copy_to_host(t, backend, stream);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = element_as_double(t.dtype(), raw.data() + i * dtype_size(t.dtype()));
  }
  return out;
}

void copy_from_host_as(const std::vector<double>& values, const Tensor& t, Backend& backend,
                       Stream& stream) {
  MOEPEAK_CHECK(static_cast<int64_t>(values.size()) == t.numel(),
                "copy_from_host_as: ", values.size(), " values for ", t.str());
  if (values.empty()) return;
  std::vector<char> raw(t.nbytes());
  for (size_t i = 0; i < values.size(); ++i) {
    store_element(t.dtype(), values[i], raw.data() + i * dtype_size(t.dtype()));
  }
  backend.copy_async(
      t.data(), raw.data(), raw.size(),
      t.placement() == Placement::host ? CopyKind::host_to_host : CopyKind::host_to_device, stream);
  stream.synchronize();  // `raw` dies on return
}

int visible_cuda_device(int wanted, int visible, const char* cuda_visible_devices) {
  const std::string env = cuda_visible_devices
                              ? "CUDA_VISIBLE_DEVICES=" + std::string(cuda_visible_devices)
                              : std::string("CUDA_VISIBLE_DEVICES unset");
  MOEPEAK_CHECK(visible > 0, "runtime.backend = \"cuda\" but no CUDA device is usable (", env, ")");
  MOEPEAK_CHECK(wanted >= 0, "CUDA device ", wanted, " requested: an ordinal is >= 0");
  if (wanted < visible) return wanted;
  if (visible == 1) return 0;
  MOEPEAK_THROW("this rank wants CUDA device ", wanted,
                " (its local rank, or its GPU in runtime.probe_file) but sees only ", visible, " (",
                env,
                "): give each rank one GPU (srun --gpus-per-task=1) or let every "
                "rank of the node see all of them");
}

bool Backend::cuda_available() {
#ifdef MOEPEAK_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moepeak
