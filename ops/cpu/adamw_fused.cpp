// CPU adamw_fused: arguments checked on the caller's thread, then one adamw_span (AVX2 when the
// CPU has it) with the working-weight output on the stream's worker. See ops/adamw_fused.h.
// Test: ctest -R test_adamw_kernels
#include "core/runtime/cpu_stream.h"
#include "ops/adamw_fused.h"
#include "ops/cpu/adamw_simd.h"

namespace moepeak::ops {

void adamw_fused_cpu(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream) {
  const int64_t n = master.numel();
  MOEPEAK_CHECK(working.dtype() == master.dtype(),
                "adamw_fused on the CPU updates working weights of the "
                "master's dtype; got master ",
                master.str(), " and working weights ", working.str(),
                " (bf16 working weights need the CUDA kernel)");
  for (const Tensor* t : {&grad, &m, &v, &working}) {
    MOEPEAK_CHECK(t->numel() == n && t->dtype() == master.dtype(), "adamw_fused: master ",
                  master.str(), " with ", t->str());
  }
  MOEPEAK_CHECK(hyper.step >= 1, "adamw_fused: step ", hyper.step, " (steps count from 1)");
  dispatch_float(master.dtype(), "adamw_fused", [&](auto zero) {
    using T = decltype(zero);
    T* p = master.data_as<T>();
    const T* g = grad.data_as<T>();
    T* mm = m.data_as<T>();
    T* vv = v.data_as<T>();
    T* w = working.data_as<T>();
    const AdamWScalars<T> s = AdamWScalars<T>::make(hyper, decay);
    as_cpu_stream(stream).enqueue([=] { adamw_span<T>(p, g, mm, vv, w, n, s); });
  });
}

}  // namespace moepeak::ops
