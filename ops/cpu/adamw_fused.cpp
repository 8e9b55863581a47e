// CPU adamw_fused: arguments checked on the caller's thread (the CPU's dtype rule, then
// check_adamw_fused_args, shared with the CUDA kernel in ops/cuda/adamw.cu), then one adamw_span
// (AVX2 when the CPU has it) with the working-weight output on the stream's worker; with bf16
// working weights, adamw_span runs a chunk at a time on the widened gradient (or the f32 one as it
// is) and the chunk's new master is rounded to bf16. See ops/adamw_fused.h.
// Test: ctest -R test_adamw_kernels
#include "ops/adamw_fused.h"

#include <algorithm>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

// An f32 master, m, v with bf16 working weights and a bf16 gradient: the gradient widened
// (exactly) kChunk elements at a time into fixed scratch, then adamw_span_bf16_working
// (adamw_simd.h) on the chunk, as for the fp32 main gradient. The update is element-wise, so the
// chunking changes no bit: master, m and v are adamw_span<float>'s (hence adamw_cpu's, the
// resident update's) on the fp32 gradient, the working weights the new master rounded once.
constexpr int64_t kChunk = 2048;  // 8 KiB of fp32 gradient: in L1 with the chunk's state

void adamw_span_bf16_grad(float* master, const bf16* grad, float* m, float* v, bf16* working,
                          int64_t n, const AdamWScalars<float>& s) {
  float widened[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    widen(grad + i, widened, len);
    adamw_span_bf16_working(master + i, widened, m + i, v + i, working + i, len, s);
  }
}

}  // namespace

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
  const bool f32_grad = grad.dtype() == DType::f32 && working.dtype() == DType::bf16;
  MOEPEAK_CHECK(grad.dtype() == working.dtype() || f32_grad, op, ": grad ", grad.str(),
                " with working ", working.str(),
                " (the gradient takes the working weights' dtype, or f32 with bf16 ones)");
  MOEPEAK_CHECK(hyper.step >= 1, op, ": step ", hyper.step, " (steps count from 1)");
}

void adamw_fused_cpu(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_fused_cpu";
  // The CPU's dtype rule first: working weights of the master's dtype, or bf16 ones of an f32
  // master (the CUDA kernel's pair).
  const bool bf16_working = master.dtype() == DType::f32 && working.dtype() == DType::bf16;
  MOEPEAK_CHECK(working.dtype() == master.dtype() || bf16_working, op,
                " updates working weights of the master's dtype, or bf16 working weights of an "
                "f32 master; got master ",
                master.str(), " and working weights ", working.str());
  check_adamw_fused_args(op, master, grad, m, v, working, hyper);
  const int64_t n = master.numel();
  if (bf16_working) {
    float* p = master.data_as<float>();
    float* mm = m.data_as<float>();
    float* vv = v.data_as<float>();
    bf16* w = working.data_as<bf16>();
    const AdamWScalars<float> s = AdamWScalars<float>::make(hyper, decay);
    if (grad.dtype() == DType::f32) {  // the fp32 main gradient (checked above)
      const float* g = grad.data_as<float>();
      as_cpu_stream(stream).enqueue([=] { adamw_span_bf16_working(p, g, mm, vv, w, n, s); });
    } else {
      const bf16* g = grad.data_as<bf16>();
      as_cpu_stream(stream).enqueue([=] { adamw_span_bf16_grad(p, g, mm, vv, w, n, s); });
    }
    return;
  }
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
