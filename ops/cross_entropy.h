// cross_entropy: per-token next-token cross-entropy on materialised logits (the standard schedule
// of the vocabulary projection; Ring-DTP is the bounded one and is tested against this).
//
//   logits:  (N, V) f32 | bf16 | f64
//   labels:  (N) i64, in [0, V) or -100 (ignored)
//   losses:  (N) logits' dtype   losses[n] = logsumexp(logits[n]) - logits[n, labels[n]],
//                                0 for an ignored position                        (written, =)
//   scale:   dL/dlosses[n] for every labelled n, e.g. 1 / (number of labelled positions)
//   dlogits: (N, V)              scale * (softmax(logits[n]) - onehot(labels[n])),
//                                0 rows for ignored positions                     (written, =)
//
// dlogits may be the very same tensor as logits: the backward then overwrites the logits with
// their gradient in place (each row's log-sum-exp is taken before the row is written).
//
// The log-sum-exp subtracts the row max and accumulates in double; the softmax is evaluated in
// double and rounded once. A label outside [0, V) other than -100 makes the stream task throw a
// moepeak::Error naming the position and the label (it surfaces at synchronize()).
// bf16 logits on the CPU: each logit is read exactly into double, the arithmetic is the f32
// path's double, and each loss and gradient is stored double -> fp32 -> bf16 (nearest even each,
// as CUDA's store_from does), so a bf16 result is bitwise the f32 CPU result on the widened
// logits, rounded to bf16 (tests/ops/test_vocab_ops.cpp).
//
// CUDA (ops/cuda/cross_entropy.cu): one block per row; f32 | bf16 storage (f64 too). The max, the
// differences y - max and y - lse and the sums are in double, the exponentials in fp32 (f64 for
// f64), and each result is rounded once (bf16 through fp32, as on the CPU); the CPU's
// exponentials are double, so the backends differ by that rounding and the sums' order. In place
// is safe: the block finishes reading the row (a block-wide barrier) before it writes any
// element. The GPU does not throw on a bad label: a label outside [0, V) other than -100 gives
// that row a NaN loss (forward) and a NaN gradient row (backward), and reads nothing outside the
// row. CUDA against the CPU: tests/ops/backend_ops/cases_cross_entropy.cpp.
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

inline constexpr int64_t kIgnoreLabel = -100;

void cross_entropy_forward_cpu(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                               Stream& stream);
void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& labels, double scale,
                                const Tensor& dlogits, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_cross_entropy_forward_args(const char* op, const Tensor& logits, const Tensor& labels,
                                      const Tensor& losses);
void check_cross_entropy_backward_args(const char* op, const Tensor& logits, const Tensor& labels,
                                       const Tensor& dlogits);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                                Stream& stream);
void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& labels, double scale,
                                 const Tensor& dlogits, Stream& stream);
inline void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                                  Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_forward, losses, logits, labels, losses, stream);
}
inline void cross_entropy_backward(const Tensor& logits, const Tensor& labels, double scale,
                                   const Tensor& dlogits, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_backward, dlogits, logits, labels, scale, dlogits, stream);
}

}  // namespace moepeak::ops
