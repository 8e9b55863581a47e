// DecoderSpec: what a decoder is made of, layer by layer — the description a model family
// (core/model/families/) makes of a ModelConfig and that the decoder (core/model/decoder.h), the
// parameter layout (param_layout.h), the ZeRO-3 store and the memory functions the planner sums
// (decoder_memory.h) read. None of those names a family: they ask the description.
//
//   embedding -> L x [x += attention(norm(x)); x += mlp(norm(x))] -> norm -> head -> cross-entropy
//
//   attention  grouped-query (nh query heads, nkv key/value heads of head_dim), RoPE on q and k,
//              optionally an RMSNorm over head_dim on every q and k head before RoPE (qk_norm),
//              biases on q/k/v/o, a learned sink logit per head, a sliding window
//   mlp        dense SwiGLU of width `intermediate`, or MoE: a router (softmax over all experts
//              then top-k, renormalised or not; or top-k of the logits then a softmax over the k;
//              with or without a bias) and `experts` experts of width `intermediate` (SwiGLU or
//              gpt-oss's clamped SwiGLU, with or without biases)
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

enum class AttentionKind { grouped_query };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::grouped_query;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool qk_norm = false;  // RMSNorm (weights [head_dim], the model's eps) on each q and k head
  bool bias = false;     // q/k/v/o projections with biases
  bool sinks = false;    // a learned logit per query head in every row's softmax (ops/attention.h)
  int64_t window = 0;    // 0: every earlier key; W > 0: the query and the W - 1 keys before it
  bool operator==(const AttentionSpec&) const = default;
};

enum class MlpKind { dense, moe };

// How router logits become the top-k experts and their weights: the op's enum (ops/router.h),
// softmax_then_topk (softmax over all experts in fp32, top-k of the probabilities) or
// topk_then_softmax (top-k of the logits, softmax over the k: gpt-oss).
using ops::RouterScore;

struct RouterSpec {
  RouterScore score = RouterScore::softmax_then_topk;
  int64_t top_k = 0;
  bool renormalize = true;  // the k weights divided by their sum
  bool bias = false;        // logits = x W^T + b
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

  // Layers with experts, and their expert count (every MoE layer has the same; 0 when none).
  int64_t moe_layers() const;
  int64_t experts() const;
  int64_t top_k() const;  // of the MoE layers (0 when none)
  bool any_dense() const;
  bool any_qk_norm() const;
  bool any_attention_bias() const;
  bool any_sinks() const;
  bool operator==(const DecoderSpec&) const = default;
};

// The description of `model` by its family (core/model/families/family.h). Throws moepeak::Error
// naming the [model] key when the config sets a field the family does not have or cannot take
// (e.g. mlp_only_layers for mixtral), so a config is never run with another family's semantics.
DecoderSpec describe_decoder(const ModelConfig& model);

}  // namespace moepeak
