// cross_entropy: per-token next-token cross-entropy on materialised logits (the standard schedule
// of the vocabulary projection; Ring-DTP is the bounded one and is tested against this).
//
//   logits:  (N, V) f32 | f64
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

}  // namespace moepeak::ops
