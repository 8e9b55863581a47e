// adamw: the element-wise AdamW update (decoupled weight decay, bias correction), in the exact
// operation order of torch.optim.AdamW (foreach=False), with the global-norm clipping factor
// applied to the gradient on the way in. Every optimizer placement (resident, offload_serial,
// offload_stream) runs this one kernel, so their results are bitwise equal.
//
//   param, m, v (n)  fp32 (f64 in tests), updated in place;  grad (n) same dtype
//   per element:  g = grad * grad_scale
//                 m = beta1 * m + (1 - beta1) * g
//                 v = beta2 * v + (1 - beta2) * g * g
//                 param *= 1 - lr * weight_decay                    (if decay)
//                 param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The CPU op (ops/cpu/adamw.cpp: adamw_span of ops/cpu/adamw_simd.h, AVX2 where the CPU has it)
// runs f32 or f64. The CUDA kernel (ops/cuda/adamw.cu) runs f32
// or f64 (bf16 is rejected naming the dtype) and does, with f32 state, exactly the CPU f32
// path's sequence of correctly rounded IEEE operations, without FMA contraction, so its param, m
// and v are bitwise the CPU's (the NOTES in ops/cuda/adamw.cu). n == 0 is allowed.
// Test: tests/ops/test_adamw_kernels.cpp (CPU), tests/ops/backend_ops/cases_adamw.cpp (CUDA
// against the f64 CPU reference).
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

struct AdamWHyper {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;         // t, 1-based
  double grad_scale = 1.0;  // clipping factor (1 = no clipping)
};

void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWHyper& hyper, bool decay, Stream& stream);

// The checks both backends run at the call (throw moepeak::Error naming `op`): grad, m and v of
// param's numel and dtype, step >= 1. Each backend then rejects the dtypes it does not run.
void check_adamw_args(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                      const Tensor& v, const AdamWHyper& hyper);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void adamw_cuda(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWHyper& hyper, bool decay, Stream& stream);
inline void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const AdamWHyper& hyper, bool decay, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(adamw, param, param, grad, m, v, hyper, decay, stream);
}

}  // namespace moepeak::ops
