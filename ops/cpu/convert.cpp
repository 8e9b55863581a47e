// CPU convert: a typed loop per (in, out) dtype pair.
#include "ops/convert.h"
#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {
namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

template <typename T>
double load(const T* p, int64_t i) {
  return static_cast<double>(p[i]);
}
template <>
double load<bf16>(const bf16* p, int64_t i) {
  return static_cast<float>(p[i]);
}
template <typename T>
void store(T* p, int64_t i, double v) {
  p[i] = static_cast<T>(v);
}
template <>
void store<bf16>(bf16* p, int64_t i, double v) {
  // NOTES: f64 -> bf16 goes through f32; double rounding can differ from a direct rounding only
  // for values within 2^-24 relative of a bf16 tie, far below bf16's own 2^-8 resolution.
  p[i] = bf16(static_cast<float>(v));
}

template <typename In, typename Out>
void convert_loop(const void* in, void* out, int64_t n) {
  auto* src = static_cast<const In*>(in);
  auto* dst = static_cast<Out*>(out);
  for (int64_t i = 0; i < n; ++i) store<Out>(dst, i, load<In>(src, i));
}

template <typename In>
void convert_from(const void* in, void* out, DType out_type, int64_t n) {
  switch (out_type) {
    case DType::f32:
      return convert_loop<In, float>(in, out, n);
    case DType::bf16:
      return convert_loop<In, bf16>(in, out, n);
    case DType::f64:
      return convert_loop<In, double>(in, out, n);
    default:
      break;
  }
}

}  // namespace

void check_convert_args(const Tensor& in, const Tensor& out) {
  MOEPEAK_CHECK(is_float(in.dtype()) && is_float(out.dtype()),
                "convert supports f32, bf16, f64; got ", in.str(), " -> ", out.str());
  MOEPEAK_CHECK(in.numel() == out.numel(), "convert: ", in.str(), " and ", out.str(),
                " differ in element count");
}

void convert_cpu(const Tensor& in, const Tensor& out, Stream& stream) {
  check_convert_args(in, out);
  const void* src = in.data();
  void* dst = out.data();
  DType in_type = in.dtype(), out_type = out.dtype();
  int64_t n = in.numel();
  as_cpu_stream(stream).enqueue([=] {
    switch (in_type) {
      case DType::f32:
        return convert_from<float>(src, dst, out_type, n);
      case DType::bf16:
        return convert_from<bf16>(src, dst, out_type, n);
      case DType::f64:
        return convert_from<double>(src, dst, out_type, n);
      default:
        break;
    }
  });
}

}  // namespace moepeak::ops
