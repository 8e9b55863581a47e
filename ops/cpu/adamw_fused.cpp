// CPU adamw_fused: arguments checked on the caller's thread (the CPU's dtype rule, then
// check_adamw_fused_args, shared with the CUDA kernel in ops/cuda/adamw.cu), then one adamw_span
// (AVX2 when the CPU has it) with the working-weight output on the stream's worker. See
// ops/adamw_fused.h. Test: ctest -R test_adamw_kernels
#include "ops/adamw_fused.h"
#include "core/runtime/cpu_stream.h"
#include "ops/cpu/adamw_simd.h"

namespace moepeak::ops {

void check_adamw_fused_args(const char* op, const Tensor& master, const Tensor& grad,
                            const Tensor& m, const Tensor& v, const Tensor& working,
                            const AdamWHyper& hyper) {
  const int64_t n = master.numel();
  for (const Tensor* t : {&grad, &m, &v, &working}) {
    MOEPEAK_CHECK(t->numel() == n, op, ": master ", master.str(), " with ", t->str(),
                  " (every tensor takes master's size)");
  }
  for (const Tensor* t : {&m, &v}) {
    MOEPEAK_CHECK(t->dtype() == master.dtype(), op, ": master ", master.str(), " with ", t->str(),
                  " (m and v take master's dtype)");
  }
  MOEPEAK_CHECK(grad.dtype() == working.dtype(), op, ": grad ", grad.str(), " with working ",
                working.str(), " (the gradient takes the working weights' dtype)");
  MOEPEAK_CHECK(hyper.step >= 1, op, ": step ", hyper.step, " (steps count from 1)");
}

void adamw_fused_cpu(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_fused_cpu";
  // The CPU's dtype rule first: bf16 working weights are the usual mistake, and its message says
  // where they run.
  MOEPEAK_CHECK(working.dtype() == master.dtype(), op,
                " updates working weights of the master's dtype; got master ", master.str(),
                " and working weights ", working.str(),
                " (bf16 working weights need the CUDA kernel, adamw_fused_cuda)");
  check_adamw_fused_args(op, master, grad, m, v, working, hyper);
  const int64_t n = master.numel();
  dispatch_float(master.dtype(), op, [&](auto zero) {
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
