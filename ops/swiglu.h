// swiglu: the gated activation inside each expert and dense MLP, h = silu(w1 x) * (w3 x), and
// gpt-oss's clamped form.
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
//
// The clamped SwiGLU (gpt-oss's GptOssExperts), the overloads that take SwigluParams:
//   g = min(a, limit),  u = clamp(b, -limit, limit),  s = sigmoid(alpha * g)
//   h  = (u + up_offset) * (g * s)                                          (written, =)
//   da = dh * (u + up_offset) * (s + alpha * g * s * (1 - s))  where a <= limit, else 0   (=)
//   db = dh * (g * s)                                   where -limit <= b <= limit, else 0   (=)
// The masks are PyTorch's clamp gradient: inclusive bounds, so an element exactly at a bound
// passes its gradient (and a NaN input gets 0, as torch.where in clamp_backward gives it). The
// parameters are rounded to the compute type first (7.0 and 1.702 in gpt-oss: limit exact, alpha
// fp32's nearest for f32 and bf16 storage); the same precision rules as above (one rounding per
// output). The default SwigluParams (alpha 1, no limit, up_offset 0) is today's silu(a) * b and
// runs the plain ops above, bitwise unchanged (SwigluParams::is_plain()). da or db may alias an
// input in both forms (every input element is read before either output is written).
// Test: tests/ops/test_moe_ops.cpp and tests/ops/test_gpt_oss_ops.cpp (CPU);
// tests/ops/backend_ops/cases_swiglu.cpp (each backend against the f64 CPU reference).
#pragma once

#include <limits>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// The clamped form's parameters (see above). The defaults are the plain SwiGLU.
struct SwigluParams {
  double alpha = 1.0;                                      // the sigmoid's slope
  double limit = std::numeric_limits<double>::infinity();  // the clamp of a (above) and b (both)
  double up_offset = 0.0;                                  // added to the clamped b

  // gpt-oss (transformers' GptOssExperts): limit = config.swiglu_limit (7.0), alpha 1.702, and
  // (up + 1) * glu.
  static SwigluParams gpt_oss(double limit = 7.0, double alpha = 1.702) {
    return SwigluParams{alpha, limit, 1.0};
  }
  // True for the defaults: the plain ops run.
  bool is_plain() const {
    return alpha == 1.0 && limit == std::numeric_limits<double>::infinity() && up_offset == 0.0;
  }
};

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream);
void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                         const Tensor& db, Stream& stream);
void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const SwigluParams& params,
                        const Tensor& h, Stream& stream);
void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh,
                         const SwigluParams& params, const Tensor& da, const Tensor& db,
                         Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_swiglu_forward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& h);
void check_swiglu_backward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& dh,
                                const Tensor& da, const Tensor& db);
// limit > 0 (possibly infinite), alpha and up_offset finite.
void check_swiglu_params(const char* op, const SwigluParams& params);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void swiglu_forward_cuda(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream);
void swiglu_backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                          const Tensor& db, Stream& stream);
void swiglu_forward_cuda(const Tensor& a, const Tensor& b, const SwigluParams& params,
                         const Tensor& h, Stream& stream);
void swiglu_backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dh,
                          const SwigluParams& params, const Tensor& da, const Tensor& db,
                          Stream& stream);
inline void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_forward, h, a, b, h, stream);
}
inline void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                            const Tensor& db, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_backward, da, a, b, dh, da, db, stream);
}
inline void swiglu_forward(const Tensor& a, const Tensor& b, const SwigluParams& params,
                           const Tensor& h, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_forward, h, a, b, params, h, stream);
}
inline void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dh,
                            const SwigluParams& params, const Tensor& da, const Tensor& db,
                            Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(swiglu_backward, da, a, b, dh, params, da, db, stream);
}

}  // namespace moepeak::ops
