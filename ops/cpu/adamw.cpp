// CPU AdamW: adamw_span (ops/cpu/adamw_simd.h: AVX2 where the CPU has it, else scalar) over the
// rank's compute threads (parallel_ranges: adamw_span is bitwise the same however the elements
// are split); the scalars computed once per call. The argument checks (check_adamw_args) are
// shared with the CUDA kernel (ops/cuda/adamw.cu).
#include "ops/adamw.h"
#include "core/runtime/cpu_stream.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/cpu/parallel_ranges.h"

namespace moepeak::ops {
namespace {

// Elements per parallel range: 7 streams of 4 bytes each, ~2 MiB a range in f32.
constexpr int64_t kElementsPerTask = 65536;

}  // namespace

void check_adamw_args(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                      const Tensor& v, const AdamWHyper& hyper) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&grad, &m, &v}) {
    MOEPEAK_CHECK(t->numel() == n && t->dtype() == param.dtype(), op, ": param ", param.str(),
                  " with ", t->str(), " (grad, m and v take param's size and dtype)");
  }
  MOEPEAK_CHECK(hyper.step >= 1, op, ": step ", hyper.step, " (steps count from 1)");
}

void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_cpu";
  check_adamw_args(op, param, grad, m, v, hyper);
  const int64_t n = param.numel();
  dispatch_float(param.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* p = param.data_as<T>();
    const T* g = grad.data_as<T>();
    T* mm = m.data_as<T>();
    T* vv = v.data_as<T>();
    const AdamWScalars<T> scalars = AdamWScalars<T>::make(hyper, decay);
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
        adamw_span<T>(p + begin, g + begin, mm + begin, vv + begin, nullptr, end - begin, scalars,
                      AdamWSimd::automatic);
      });
    });
  });
}

}  // namespace moepeak::ops
