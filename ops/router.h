// router: Mixtral's top-k expert selection (block_sparse_moe.gate, after the gate's linear).
//
//   logits:       (N, E) f32 | f64    router logits x W_g^T
//   probs:        (N, E) same dtype   softmax over all E experts                    (written, =)
//   topk_index:   (N, k) i32          the k most probable experts, most probable first; equal
//                                     probabilities go to the lower expert index   (written, =)
//   topk_weight:  (N, k) same dtype   probs of the chosen experts renormalised to sum 1  (=)
//   dtopk_weight: (N, k)
//   dlogits:      (N, E)              dL/dlogits through renormalisation and softmax    (=)
//
// Forward precision: the softmax subtracts the row max, exponentiates in the tensors' dtype and
// sums in double; the renormalising sum is also taken in double.
//
// Backward: the selection is piecewise constant, so the gradient flows only through the weights.
// The renormalised weights are a softmax over the selected logits alone,
//   topk_weight_j = exp(l_j) / sum_{m selected} exp(l_m),
// so the exact gradient is dlogits[m] = w_m * (dw_m - sum_j dw_j w_j) for a selected expert m and
// 0 for the others (the full softmax's normaliser cancels). It is computed in double from
// topk_weight; probs supplies the shape. The task throws (naming row and slot) if topk_index holds
// an expert outside [0, E) or the same expert twice.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void router_forward_cpu(const Tensor& logits, int k, const Tensor& probs, const Tensor& topk_index,
                        const Tensor& topk_weight, Stream& stream);
void router_backward_cpu(const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         const Tensor& dtopk_weight, const Tensor& dlogits, Stream& stream);

// The load-balancing loss's path through the full softmax: with dL/dprobs[n, e] = dprobs[e] for
// every row (Mixtral's auxiliary loss is linear in each expert's mean probability),
//   dlogits[n, e] += probs[n, e] * (dprobs[e] - sum_j probs[n, j] * dprobs[j])        (+=)
//   probs (N, E), dprobs (E), dlogits (N, E); the row sum in double.
void router_aux_backward_cpu(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                             Stream& stream);

}  // namespace moepeak::ops
