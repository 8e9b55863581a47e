// router: top-k expert selection after the gate's linear (Mixtral's block_sparse_moe.gate, with the
// chosen weights renormalised; Qwen3-MoE's router, which renormalises when norm_topk_prob;
// gpt-oss's GptOssTopKRouter, top-k of the logits then a softmax over those k; DeepSeek-V3's
// DeepseekV3TopkRouter, sigmoid scores with a choice-only correction bias and group-limited
// top-k), and the load-balancing loss's path through the full softmax.
//
// RouterScore (the `score` argument) says how logits become the choice and its weights:
//   softmax_then_topk  (Mixtral, Qwen3-MoE) the softmax over all E, then the k most probable;
//                      weights the chosen probs, renormalised to sum 1 or not (`renormalize`)
//   topk_then_softmax  (gpt-oss) the k largest logits, then a softmax over those k logits
//                      (`renormalize` must be true: the weights sum to 1 by construction; the
//                      call throws otherwise). The router's bias (x W^T + b) is ops/bias.h's.
//   sigmoid_group_limited (DeepSeek-V3, Kimi-K2) sigmoid scores, a correction bias added for the
//                      choice only, the choice limited to the best groups of experts; weights
//                      the chosen (unbiased) scores, renormalised or not (`renormalize` is
//                      norm_topk_prob), times a scaling factor. Its parameters come in
//                      GroupLimitedRouting (below; the other two scores take its defaults).
//
//   logits:       (N, E) f32 | bf16 | f64   router logits x W_g^T (both backends)
//   probs:        (N, E) same dtype   softmax over all E experts                    (written, =)
//                                     sigmoid_group_limited: the sigmoid scores
//   topk_index:   (N, k) i32          the k most probable experts, most probable first; equal
//                                     probabilities go to the lower expert index   (written, =)
//                                     topk_then_softmax: the k largest logits, largest first,
//                                     equal logits to the lower index
//   topk_weight:  (N, k) same dtype   renormalize: probs of the chosen experts renormalised to
//                                     sum 1; else the chosen probs themselves (copied from
//                                     probs, bit for bit)                               (=)
//                                     topk_then_softmax: the softmax over the chosen logits
//                                     sigmoid_group_limited: see its section below
//   dtopk_weight: (N, k)
//   dlogits:      (N, E)              dL/dlogits through the weights and softmax (or the
//                                     sigmoid)                                          (=)
//
// Forward precision: the softmax subtracts the row max, exponentiates in the tensors' compute
// type (fp32 for f32 and bf16, double for f64) and sums in double; probs is rounded to the
// storage dtype, and the selection and renormalisation read the stored probs; the renormalising
// sum is also taken in double. Without renormalisation topk_weight_j = probs[topk_index_j]
// exactly (no arithmetic), on both backends.
// topk_then_softmax: probs is the same full softmax (bit for bit the softmax_then_topk run's: the
// load-balancing loss reads it). The selection reads the logits as stored (so the logits' own
// ties, not the probs' rounding, decide), and NaN ranks after every number (a row of NaN picks
// experts 0..k-1). The weights are a max-subtracted softmax over the k chosen logits: exp(l_j -
// l_max) in the compute type (fp32 for f32 and bf16, double for f64), the sum in double, each
// weight rounded once to the storage dtype (via fp32 for bf16). Mathematically these are the
// softmax_then_topk renormalised weights (p_j / sum of the chosen p), but computed from the
// logits rather than the rounded probs. The selection and the weights read the logits before
// probs is written, so probs may be the logits tensor itself in both modes.
//
// Backward (softmax_then_topk, topk_then_softmax): the selection is piecewise constant, so the
// gradient flows only through the weights; `renormalized` must be the forward's `renormalize`.
// Both cases are computed in double and each output rounded once to the storage dtype (via fp32
// for bf16).
//   renormalized: the weights are a softmax over the selected logits alone,
//     topk_weight_j = exp(l_j) / sum_{m selected} exp(l_m),
//   so the exact gradient is dlogits[m] = w_m * (dw_m - sum_j dw_j w_j) for a selected expert m
//   and 0 for the others (the full softmax's normaliser cancels). It is computed from
//   topk_weight; probs supplies the shape. This is also topk_then_softmax's backward (its
//   weights are that softmax by definition): pass renormalized = true (checked against float64
//   finite differences in tests/ops/test_gpt_oss_router_norm.cpp).
//   not renormalized: topk_weight_j = p_{e_j} with p the full softmax, so the gradient flows
//   through the full softmax to EVERY expert: with g_e = dw_j of the slot j choosing e (0 for an
//   expert no slot chooses) and s = sum_j dw_j w_j,
//     dlogits[e] = p_e * (g_e - s)     (an unchosen expert gets -p_e * s),
//   computed from the stored probs (p) and topk_weight (w, in s).
// The task throws (naming row and slot) if topk_index holds an expert outside [0, E) or the same
// expert twice.
//
// CUDA (ops/cuda/router.cu): one warp per token; f32 | bf16 storage (f64 too), the exponentials
// in fp32 (f64 for f64), the sums in double. probs is rounded to the storage dtype and the
// selection and renormalisation read the rounded probs, as the CPU reads its stored probs: the
// same repeated arg-max with equal probabilities to the lower index, so topk_index equals the
// CPU's whenever the probs do (a row whose probs are all NaN selects experts 0..k-1 on both).
// topk_then_softmax: the same arg-max over the stored logits (NaN last, as on the CPU), so
// topk_index equals the CPU's always; the weights' sum is added in slot order as on the CPU.
// The backward does not throw: a slot whose expert is outside [0, E), or repeats an earlier
// slot's expert, contributes no g_e (sum_j dw_j w_j still runs over all k slots); the experts no
// valid slot names get 0 (renormalized) or -p_e * s (not).
//
// CPU with bf16 storage (ops/cpu/router.cpp): the same semantics with the CPU's summation order.
// The exponentials are fp32 (kept in a row of scratch, not in bf16 probs), probs[e] =
// bf16(fp32(exp_e / sum)); the selection reads the bf16 probs (ties, including those the
// rounding creates, to the lower index, as on CUDA) and topk_weight = bf16(fp32(p / chosen
// sum)) of those bf16 probs (or those bf16 probs themselves without renormalisation). So probs
// is the CPU's f32 probs rounded once, while topk_index and topk_weight are computed from the
// rounded probs (not the f32 ones rounded). The backwards compute in double from the stored
// values and round each output once (via fp32); the aux backward's += rounds the double term to
// fp32, adds in fp32 and rounds to bf16 once.
//
// sigmoid_group_limited (DeepSeek-V3's DeepseekV3TopkRouter; Kimi-K2 is groups = topk_groups = 1),
// with r = routing.scaling (routed_scaling_factor) and G = E / groups experts per group, group g
// the contiguous experts g*G .. g*G + G-1:
//   probs[e]      = s_e = sigmoid(l_e)     (written, =; kept for the sequence-wise balance loss)
//   choice_e      = s_e + correction_bias[e]             (e_score_correction_bias; not written)
//   group score   = the sum of the group's two largest choice values; the topk_groups groups of
//                   the largest scores are kept, and only their experts can be chosen
//   topk_index    = the k experts of the kept groups with the largest choice, largest first
//   topk_weight_j = r * s_j / (sum_m s_m + 1e-20) (renormalize: norm_topk_prob) or r * s_j,
//                   s_j the chosen experts' scores WITHOUT the bias
// The order: equal choice values go to the lower expert index, equal group scores to the lower
// group index, and NaN ranks after every number (-inf included) among experts and groups alike
// (transformers' torch.topk would rank NaN first: moepeak never prefers a NaN). A group's score
// adds its first two experts in that order, so it is NaN only when the group has fewer than two
// non-NaN choices; a row of NaN keeps groups 0..topk_groups-1 and picks their first k experts in
// index order. With groups = topk_groups = 1 the choice is the plain top k of s + bias.
// GroupLimitedRouting's checks (moepeak::Error at the call): groups divides E with G >= 2 (a
// group score needs two experts), 1 <= topk_groups <= groups, k <= topk_groups * G (the kept
// groups hold k experts), correction_bias (E) of f32 for f32 and bf16 logits and f64 for f64
// logits, on the logits' backend, r finite and > 0. The other scores take the defaults (groups
// = topk_groups = 1, no bias, r = 1) and throw otherwise.
// Precision: s = 1 / (1 + exp(-l)) in the compute type (fp32 for f32 and bf16, double for f64),
// rounded to the storage dtype as probs; the choice reads the stored probs: probs[e] + bias[e]
// and a group's score (one addition) are taken in the compute type. The weights are computed in
// double from the stored probs (their sum added in slot order) and each rounded once to the
// storage dtype (via fp32 for bf16); without renormalisation and with r = 1 topk_weight_j =
// probs[topk_index_j] bit for bit. probs may be the logits tensor itself.
// Backward (router_backward with the forward's score and routing; only routing.scaling is read):
// the selection is piecewise constant and the bias gets no gradient (DeepSeek moves it by a
// balancing rule instead: ops/router_balance.h). With s_j = probs[topk_index_j], S = sum_j s_j,
// D = S + 1e-20 and T = sum_j dw_j s_j,
//   renormalized:      ds_j = r * (dw_j - T / D) / D        (w_j = r s_j / D)
//   not renormalized:  ds_j = r * dw_j                      (w_j = r s_j)
//   dlogits[e_j] = ds_j * s_j * (1 - s_j) (the sigmoid's derivative); 0 for an unchosen expert,
// in double from the stored probs (topk_weight supplies the shape and is not read), each output
// rounded once to the storage dtype (via fp32 for bf16). dlogits may be probs itself. The CPU
// throws on a bad slot as above; CUDA skips a slot outside [0, E) or repeating an earlier slot's
// expert entirely (it adds to neither S, T nor any gradient).
// CUDA: one warp per token, as above, for any E (each lane loops over its experts e = lane + 32 i);
// each warp keeps its token's group scores in shared memory (groups values of the compute type,
// 8 warps a block: the call throws only where the device cannot give that much), and the choices
// and group scores are the CPU's arithmetic, so topk_index equals the CPU's whenever the probs do.
//
// CUDA against the CPU: tests/ops/backend_ops/cases_router.cpp; the CPU's bf16 path:
// tests/ops/test_moe_ops.cpp (Bf16Storage); topk_then_softmax: test_gpt_oss_router_norm.cpp;
// sigmoid_group_limited on the CPU: tests/ops/test_router_group_limited.cpp.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// How router logits become the top-k experts and their weights (see above). The model's
// description names it too (core/model/decoder_spec.h's RouterSpec).
enum class RouterScore {
  softmax_then_topk,  // softmax over all experts, top-k of the probabilities (Mixtral, Qwen3-MoE)
  topk_then_softmax,  // top-k of the logits, softmax over those k (gpt-oss)
  sigmoid_group_limited,  // sigmoid scores, biased group-limited top-k (DeepSeek-V3, Kimi-K2)
};

// sigmoid_group_limited's parameters (DeepSeek-V3's config names in quotes); the defaults are
// what the other scores require.
struct GroupLimitedRouting {
  int64_t groups = 1;       // "n_group": E / groups contiguous experts each
  int64_t topk_groups = 1;  // "topk_group": the groups kept for the choice
  Tensor correction_bias;   // (E) "e_score_correction_bias": f32 (f64 for f64 logits)
  double scaling = 1.0;     // "routed_scaling_factor": multiplies every weight
};

// NOTES: `routing` (and the backward's `score`) come after the stream, as rmsnorm_forward's
// `order` does, so that they default and every existing call reads as before.
void router_forward_cpu(const Tensor& logits, int k, RouterScore score, bool renormalize,
                        const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                        Stream& stream, const GroupLimitedRouting& routing = {});
void router_backward_cpu(const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         const Tensor& dtopk_weight, bool renormalized, const Tensor& dlogits,
                         Stream& stream, RouterScore score = RouterScore::softmax_then_topk,
                         const GroupLimitedRouting& routing = {});

// The load-balancing loss's path through the full softmax: with dL/dprobs[n, e] = dprobs[e] for
// every row (the auxiliary loss is linear in each expert's mean probability),
//   dlogits[n, e] += probs[n, e] * (dprobs[e] - sum_j probs[n, j] * dprobs[j])        (+=)
//   probs (N, E), dprobs (E), dlogits (N, E); the row sum in double.
// NOTES: softmax probs only. sigmoid_group_limited's probs are sigmoid scores, whose derivative
// is s (1 - s), and DeepSeek-V3's sequence-wise balance loss reads s / sum(s): its path to the
// logits is router_sequence_aux_backward below.
void router_aux_backward_cpu(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                             Stream& stream);

// DeepSeek-V3's sequence-wise balance loss's path to the logits. probs are sigmoid scores s
// (sigmoid_group_limited's probs: unbiased, every expert); the loss is linear in each token's
// normalised scores s'_e = s_e / S, S = sum_j s_j, with weights dprobs[g, e] shared by the R = N/G
// rows of segment g (rows [g R, (g + 1) R): one sequence's tokens on this rank):
//   dlogits[n, e] += s_e (1 - s_e) (dprobs[g, e] - sum_j dprobs[g, j] s_j / S) / S      (+=)
//   probs (N, E), dprobs (G, E) with G > 0 dividing N (any G when N = 0), dlogits (N, E); the
//   sums and the product in double, rounded to the compute type once and added in it.
void router_sequence_aux_backward_cpu(const Tensor& probs, const Tensor& dprobs,
                                      const Tensor& dlogits, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`);
// also that topk_then_softmax comes with renormalize, and GroupLimitedRouting's (above). The
// backend of correction_bias is each entry point's own check.
void check_router_forward_args(const char* op, const Tensor& logits, int k, RouterScore score,
                               bool renormalize, const Tensor& probs, const Tensor& topk_index,
                               const Tensor& topk_weight, const GroupLimitedRouting& routing);
void check_router_backward_args(const char* op, const Tensor& probs, const Tensor& topk_index,
                                const Tensor& topk_weight, const Tensor& dtopk_weight,
                                const Tensor& dlogits, bool renormalized, RouterScore score,
                                const GroupLimitedRouting& routing);
void check_router_aux_backward_args(const char* op, const Tensor& probs, const Tensor& dprobs,
                                    const Tensor& dlogits);
void check_router_sequence_aux_backward_args(const char* op, const Tensor& probs,
                                             const Tensor& dprobs, const Tensor& dlogits);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void router_forward_cuda(const Tensor& logits, int k, RouterScore score, bool renormalize,
                         const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         Stream& stream, const GroupLimitedRouting& routing = {});
void router_backward_cuda(const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                          const Tensor& dtopk_weight, bool renormalized, const Tensor& dlogits,
                          Stream& stream, RouterScore score = RouterScore::softmax_then_topk,
                          const GroupLimitedRouting& routing = {});
void router_aux_backward_cuda(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                              Stream& stream);
void router_sequence_aux_backward_cuda(const Tensor& probs, const Tensor& dprobs,
                                       const Tensor& dlogits, Stream& stream);
inline void router_forward(const Tensor& logits, int k, RouterScore score, bool renormalize,
                           const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                           Stream& stream, const GroupLimitedRouting& routing = {}) {
  MOEPEAK_OP_ON_BACKEND(router_forward, probs, logits, k, score, renormalize, probs, topk_index,
                        topk_weight, stream, routing);
}
inline void router_backward(const Tensor& probs, const Tensor& topk_index,
                            const Tensor& topk_weight, const Tensor& dtopk_weight,
                            bool renormalized, const Tensor& dlogits, Stream& stream,
                            RouterScore score = RouterScore::softmax_then_topk,
                            const GroupLimitedRouting& routing = {}) {
  MOEPEAK_OP_ON_BACKEND(router_backward, dlogits, probs, topk_index, topk_weight, dtopk_weight,
                        renormalized, dlogits, stream, score, routing);
}
inline void router_aux_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                                Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(router_aux_backward, dlogits, probs, dprobs, dlogits, stream);
}
inline void router_sequence_aux_backward(const Tensor& probs, const Tensor& dprobs,
                                         const Tensor& dlogits, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(router_sequence_aux_backward, dlogits, probs, dprobs, dlogits, stream);
}

}  // namespace moepeak::ops
