// cross_entropy_strip: next-token cross-entropy folded over vocabulary strips with an online
// log-sum-exp, so the (N, V) logits never exist at once (the per-strip steps of Ring-DTP,
// ops/schedules/vocab_ring_dtp.h; the materialised reference is ops/cross_entropy.h).
//
// A strip holds the logits of vocabulary columns [column_begin, column_begin + C) for N tokens.
// Each token keeps a running state of three doubles,
//
//   state: (N, 3) f64   [m, z, t]   m = max of the logits folded so far (-inf before any),
//                                   z = sum of exp(logit - m) over them,
//                                   t = the target logit once its column was folded (else 0)
//
// so that after every column of the vocabulary has been folded exactly once,
//   lse = m + log(z)  and  loss = lse - t.
//
//   cross_entropy_state_init_cpu(state)                  state = (-inf, 0, 0)    (written, =)
//   cross_entropy_strip_forward_cpu(strip, labels, column_begin, state)
//       strip  (N, C) f32 | bf16 | f64;  labels (N) i64 global vocabulary ids or -100 (ignored)
//       folds the strip into the state (FlashAttention's recurrence, paper eq. 3):
//         m' = max(m, max_v y_v);  z' = z exp(m - m') + sum_v exp(y_v - m');
//         t  = y[label - column_begin] when the label is in the strip;
//       ignored tokens are skipped (their state stays (-inf, 0, 0))        (updated in place)
//   cross_entropy_state_merge_cpu(partial, state)
//       state (+)= partial, the same recurrence between two states (for states of disjoint
//       column sets: t adds, as at most one of the two holds the target); a state that has seen
//       no column (m = -inf) is the identity                                (updated in place)
//   cross_entropy_strip_backward_cpu(strip, labels, column_begin, state, scale, dstrip)
//       state: the token's final state (every column folded)
//       dstrip (N, C) = scale * (exp(y - lse) - onehot(label - column_begin)), zero rows for
//       ignored tokens; dstrip may be the strip itself (in place)               (written, =)
//
// Arithmetic: the strip max, the exponentials and the sums are taken in double, and the
// gradient is evaluated in double and rounded once, as ops/cross_entropy.h does, so the folded
// result differs from the materialised one only by the summation order of z. A bf16 strip is read
// exactly into double, so its fold (the state) is bitwise the fold of the widened f32 strip, and
// each gradient element is stored as double -> fp32 -> bf16 (nearest even each, as CUDA's
// store_from): bitwise the f32 gradient rounded to bf16 (tests/ops/test_vocab_ops.cpp).
// Labels are not range-checked here (a strip sees a part of the vocabulary only): the caller
// checks them against V; a label in no strip simply leaves t = 0.
//
// CUDA (ops/cuda/cross_entropy_strip.cu): strips f32 | bf16 (f64 too); the state is (N, 3) f64 on
// both backends and all its arithmetic (max, the sums, the rescaling exp(m - m'), lse, the merge)
// is double. The strip forward and backward run one block per token; their per-element
// exponentials exp(y - m) and exp(y - lse) take the difference in double and exponentiate in fp32
// for f32 | bf16 strips (f64 for f64), so the CPU and GPU folds differ by that rounding and the
// summation order. The backward reads each element before writing it, so in place is safe.
// CUDA against the CPU: tests/ops/backend_ops/cases_cross_entropy_strip.cpp.
//
// Test: ctest -R test_ring_dtp_ops
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void cross_entropy_state_init_cpu(const Tensor& state, Stream& stream);
void cross_entropy_strip_forward_cpu(const Tensor& strip, const Tensor& labels,
                                     int64_t column_begin, const Tensor& state, Stream& stream);
void cross_entropy_state_merge_cpu(const Tensor& partial, const Tensor& state, Stream& stream);
void cross_entropy_strip_backward_cpu(const Tensor& strip, const Tensor& labels,
                                      int64_t column_begin, const Tensor& state, double scale,
                                      const Tensor& dstrip, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_cross_entropy_state_init_args(const char* op, const Tensor& state);
void check_cross_entropy_strip_forward_args(const char* op, const Tensor& strip,
                                            const Tensor& labels, int64_t column_begin,
                                            const Tensor& state);
void check_cross_entropy_state_merge_args(const char* op, const Tensor& partial,
                                          const Tensor& state);
void check_cross_entropy_strip_backward_args(const char* op, const Tensor& strip,
                                             const Tensor& labels, int64_t column_begin,
                                             const Tensor& state, const Tensor& dstrip);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void cross_entropy_state_init_cuda(const Tensor& state, Stream& stream);
void cross_entropy_strip_forward_cuda(const Tensor& strip, const Tensor& labels,
                                      int64_t column_begin, const Tensor& state, Stream& stream);
void cross_entropy_state_merge_cuda(const Tensor& partial, const Tensor& state, Stream& stream);
void cross_entropy_strip_backward_cuda(const Tensor& strip, const Tensor& labels,
                                       int64_t column_begin, const Tensor& state, double scale,
                                       const Tensor& dstrip, Stream& stream);
inline void cross_entropy_state_init(const Tensor& state, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_state_init, state, state, stream);
}
inline void cross_entropy_strip_forward(const Tensor& strip, const Tensor& labels,
                                        int64_t column_begin, const Tensor& state, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_strip_forward, state, strip, labels, column_begin, state,
                        stream);
}
inline void cross_entropy_state_merge(const Tensor& partial, const Tensor& state, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_state_merge, state, partial, state, stream);
}
inline void cross_entropy_strip_backward(const Tensor& strip, const Tensor& labels,
                                         int64_t column_begin, const Tensor& state, double scale,
                                         const Tensor& dstrip, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(cross_entropy_strip_backward, dstrip, strip, labels, column_begin, state,
                        scale, dstrip, stream);
}

}  // namespace moepeak::ops
