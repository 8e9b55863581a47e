// DecoderSpec: what a decoder is made of, layer by layer — the description a model family
// (core/model/families/) makes of a ModelConfig and that the decoder (core/model/decoder.h), the
// parameter layout (param_layout.h), the ZeRO-3 store and the memory functions the planner sums
// (decoder_memory.h) read. None of those names a family: they ask the description.
//
//   embedding -> L x [x += attention(norm(x)); x += mlp(norm(x))] -> norm -> head -> cross-entropy
//
//   attention  grouped-query (nh query heads, nkv key/value heads of head_dim), RoPE on q and k,
//              optionally an RMSNorm over head_dim on every q and k head before RoPE (qk_norm),
//              biases on q/k/v/o, a learned sink logit per head, a sliding window; or latent
//              (DeepSeek's multi-head latent attention): q through a low-rank bottleneck, k and v
//              from one shared latent, q/k heads of head_dim whose last rope_dim dims carry RoPE
//              (the key's one vector shared by every head), value heads of v_head_dim
//   mlp        dense SwiGLU of width `intermediate`, or MoE: a router (softmax over all experts
//              then top-k, renormalised or not; or top-k of the logits then a softmax over the k;
//              or sigmoid scores with a correction bias for the choice, group-limited top-k;
//              with or without a bias) and `experts` experts of width `intermediate` (SwiGLU or
//              gpt-oss's clamped SwiGLU, with or without biases), plus optionally shared experts
//              every token goes through (one SwiGLU of width shared_intermediate)
//   head       its own (V, H) matrix, or the embedding's (tied)
//
// docs/models.md lists the families and what each sets here.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/config/config.h"
#include "ops/rmsnorm.h"
#include "ops/rope_scaling.h"
#include "ops/router.h"

namespace moepeak {

enum class AttentionKind {
  grouped_query,  // q, k, v projections of the layer input
  // Multi-head latent attention (DeepSeek-V2/V3; transformers' DeepseekV3Attention):
  //   q    = q_b(norm_qa(q_a(x)))  (or q(x) when q_lora_rank = 0)          (N, nh, head_dim)
  //   c    = kv_a(x) = [c_kv (kv_lora_rank) | k_rope (rope_dim)]
  //   kv   = kv_b(norm_kva(c_kv))                                          (N, nh, nope + v)
  //   k_h  = [kv_h[:nope] | rope(k_rope)]  (one rotary key shared by every head)
  //   v_h  = kv_h[nope:]                                                   (N, nh, v_head_dim)
  // with nope = head_dim - rope_dim; RoPE on q's and k's last rope_dim dims only; the two latent
  // norms use latent_norm_eps (transformers' default 1e-6, not the model's eps).
  latent,
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::grouped_query;
  // Query heads, key/value heads (latent: = heads), the query/key head width (latent: nope +
  // rope) and the value head width (0 = head_dim).
  int64_t heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0;
  bool qk_norm = false;  // RMSNorm (weights [head_dim], the model's eps) on each q and k head
  bool bias = false;     // q/k/v/o projections with biases
  bool sinks = false;    // a learned logit per query head in every row's softmax (ops/attention.h)
  int64_t window = 0;    // 0: every earlier key; W > 0: the query and the W - 1 keys before it
  double scale = 0.0;    // the softmax scale on q.k (the family's; grouped-query: head_dim^-0.5)
  // latent only: the query bottleneck (0 = a plain q projection), the key/value latent, the
  // rotary tail of each q/k head, the latent norms' eps.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, rope_dim = 0;
  double latent_norm_eps = 1e-6;
  bool latent() const { return kind == AttentionKind::latent; }
  int64_t value_dim() const { return v_head_dim != 0 ? v_head_dim : head_dim; }
  bool operator==(const AttentionSpec&) const = default;
};

enum class MlpKind { dense, moe };

// How router logits become the top-k experts and their weights: the op's enum (ops/router.h),
// softmax_then_topk (softmax over all experts in fp32, top-k of the probabilities),
// topk_then_softmax (top-k of the logits, softmax over the k: gpt-oss) or sigmoid_group_limited
// (sigmoid scores, a correction bias for the choice, the best topk_groups of `groups` groups:
// DeepSeek-V3).
using ops::RouterScore;

struct RouterSpec {
  RouterScore score = RouterScore::softmax_then_topk;
  int64_t top_k = 0;
  bool renormalize = true;  // the k weights divided by their sum
  bool bias = false;        // logits = x W^T + b
  // sigmoid_group_limited: the expert groups and how many a token's experts come from, the factor
  // on the weights, and whether the choice adds a correction bias (e_score_correction_bias: a
  // parameter moved by the balancing rule, not by gradients).
  int64_t groups = 1, topk_groups = 1;
  double scaling = 1.0;
  bool correction_bias = false;
  bool operator==(const RouterSpec&) const = default;
};

enum class ExpertActivation {
  swiglu,          // down(silu(gate x) * up x)
  clamped_swiglu,  // gpt-oss: g = min(gate x, limit), u = clamp(up x, +-limit),
                   // down((u + 1) * g * sigmoid(alpha * g))
};

struct MlpSpec {
  MlpKind kind = MlpKind::moe;
  int64_t intermediate = 0;  // the dense MLP's width, or each expert's
  int64_t experts = 0;       // MoE only
  RouterSpec router;         // MoE only
  ExpertActivation activation = ExpertActivation::swiglu;
  double swiglu_limit = 0.0, swiglu_alpha = 1.0;  // clamped_swiglu only
  bool bias = false;                              // gate, up and down with biases (each expert's)
  // MoE only: the width of the shared experts' one SwiGLU, applied to every token beside the
  // routed experts and added unweighted (DeepSeek-V3: n_shared_experts * moe_intermediate_size);
  // 0 = none.
  int64_t shared_intermediate = 0;
  bool moe() const { return kind == MlpKind::moe; }
  bool operator==(const MlpSpec&) const = default;
};

struct LayerSpec {
  AttentionSpec attention;
  MlpSpec mlp;
  bool operator==(const LayerSpec&) const = default;
};

// The positional encoding: rotary, with transformers' scaling (the ModelConfig rope_* fields).
struct RopeSpec {
  ops::RopeScaling scaling;  // the type and its parameters (ops/rope_scaling.h)
  double theta = 10000.0;
  int64_t rotary_dim = 0;    // the dims each head rotates (head_dim)
  bool interleaved = false;  // pairs (2i, 2i+1) instead of (i, i + rotary_dim/2)
  int64_t max_position_embeddings = 0;
  // The op's parameters for sequences of seq_len tokens (dynamic NTK reads it; the others not).
  ops::RopeParams params(int64_t seq_len) const;
  bool operator==(const RopeSpec&) const = default;
};

struct DecoderSpec {
  ModelType family = ModelType::mixtral;
  int64_t vocab = 0, hidden = 0;
  double norm_eps = 1e-5;
  // Where every RMSNorm multiplies its weight: after rounding the normalised row to the working
  // dtype (Llama's order: Mixtral, Qwen3-MoE) or before, in fp32 (gpt-oss). Equal in f32 and f64.
  ops::NormWeightOrder norm_order = ops::NormWeightOrder::weight_after_cast;
  std::vector<LayerSpec> layers;
  RopeSpec rope;
  bool tied_embeddings = false;
  double aux_loss_coef = 0.0;  // the load-balancing loss over the MoE layers' routers; 0 = off
  // Which one: false, Switch's over the job's tokens (transformers' load_balancing_loss_func);
  // true, DeepSeek-V3's sequence-wise loss, per sequence over sigmoid_group_limited's scores
  // (core/model/decoder_sequence_aux.cpp).
  bool aux_loss_per_sequence = false;

  // Layers with experts, and their expert count (every MoE layer has the same; 0 when none).
  int64_t moe_layers() const;
  int64_t experts() const;
  int64_t top_k() const;  // of the MoE layers (0 when none)
  bool any_dense() const;
  bool any_qk_norm() const;
  bool any_attention_bias() const;
  bool any_sinks() const;
  bool any_latent() const;
  bool any_shared_experts() const;
  bool operator==(const DecoderSpec&) const = default;
};

// The description of `model` by its family (core/model/families/family.h). Throws moepeak::Error
// naming the [model] key when the config sets a field the family does not have or cannot take
// (e.g. mlp_only_layers for mixtral), so a config is never run with another family's semantics.
DecoderSpec describe_decoder(const ModelConfig& model);

}  // namespace moepeak
