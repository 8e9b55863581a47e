// swiglu: the gated activation inside each expert and dense MLP, h = silu(w1 x) * (w3 x).
//
//   a:  (M, F) f32 | bf16 | f64 (both backends)   the gate, w1 x
//   b:  (M, F) same dtype  the up projection, w3 x
//   h:  (M, F)             h = silu(a) * b, silu(a) = a * sigmoid(a)      (written, =)
//   dh: (M, F)
//   da: (M, F)             da = dh * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))   (written, =)
//   db: (M, F)             db = dh * silu(a)                              (written, =)
//
// Element-wise in the tensors' compute type (fp32 for f32 and bf16 storage, double for f64);
// sigmoid(a) = 1 / (1 + exp(-a)), which saturates cleanly to 0 or 1 for large |a|. Each element
// is read once into the compute type and each output rounded once to the storage type, so on
// the CPU a bf16 result is the f32 result on the same (bf16) inputs rounded once to bf16. M == 0
// is allowed.
// CUDA (ops/cuda/swiglu.cu): the same formulas and rounding (its exp and the association of
// db = dh * a * s may differ from the CPU's in the last fp32 bit).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream);
void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                         const Tensor& db, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_swiglu_forward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& h);
void check_swiglu_backward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& dh,
                                const Tensor& da, const Tensor& db);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void swiglu_forward_cuda(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream);
void swiglu_backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                          const Tensor& db, Stream& stream);
inline void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_forward, h, a, b, h, stream);
}
inline void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                            const Tensor& db, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_backward, da, a, b, dh, da, db, stream);
}

}  // namespace moepeak::ops
