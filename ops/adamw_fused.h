// adamw_fused: the device stage of OffloadStreamAdamW — one AdamW update of a bucket's master
// weights, m and v (staged from pinned host memory into a device slot) with the gradient that
// backward left on the device, and the refresh of the working weights from the new master, in
// one pass over the elements.
//
//   master, m, v (n)  state dtype, updated in place (the staging slot)
//   grad (n)          the working dtype, or f32 with bf16 working weights (the fp32 main
//                     gradient); on the device, where backward left it
//   working (n)       the working dtype, written (= the new master)
//   The arithmetic is ops/adamw.h's, element for element and bit for bit (ops/cpu/adamw_simd.h).
//
// The CPU kernel runs f32 or f64 with working dtype = state dtype (the working weights are then a
// separate copy of the master), and an fp32 master, m and v with bf16 working weights and a bf16
// or f32 gradient, as CUDA does: a bf16 gradient is widened to fp32 exactly (a fixed-size chunk
// at a time) and an f32 one is read as it is, the update is the f32 path's, so master, m and v
// are bitwise the f32 update of that fp32 gradient, and the working weights are the new master
// rounded to nearest even, once. Other combinations throw naming the dtypes.
// The CUDA kernel (ops/cuda/adamw.cu) runs an fp32 master, m and v with working weights in f32
// or bf16 and the gradient in the working dtype or, with bf16 working weights, in f32: a bf16
// gradient is widened to fp32 exactly and an f32 one read directly, the update is the CPU f32
// path's sequence of correctly rounded operations (no FMA contraction, so master, m and v are
// bitwise the CPU's for the same fp32 gradient), and the working weights are the new master
// (f32) or its round-to-nearest-even bf16. Other dtypes throw naming them. n == 0 is allowed.
// So with the same gradient (f32 or bf16) the two backends agree bitwise on master, m, v and the
// working weights.
// Test: tests/ops/test_adamw_kernels.cpp (AdamWFused.*, CPU, f32 and bf16 working weights with a
// bf16 or f32 gradient, bitwise), tests/ops/backend_ops/cases_adamw.cpp (each backend against the
// f64 CPU reference, f32 and bf16 working weights, with the working dtype's and an f32
// gradient).
#pragma once

#include "core/runtime/stream.h"
#include "ops/adamw.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void adamw_fused_cpu(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream);

// The checks both backends run at the call (throw moepeak::Error naming `op`): every tensor of
// master's numel, m and v of master's dtype, grad of working's dtype or f32 with bf16 working
// weights, step >= 1. Each backend then rejects the dtype combinations it does not run (see
// above).
void check_adamw_fused_args(const char* op, const Tensor& master, const Tensor& grad,
                            const Tensor& m, const Tensor& v, const Tensor& working,
                            const AdamWHyper& hyper);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void adamw_fused_cuda(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream);
inline void adamw_fused(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                        const Tensor& working, const AdamWHyper& hyper, bool decay,
                        Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(adamw_fused, master, master, grad, m, v, working, hyper, decay, stream);
}

}  // namespace moepeak::ops
