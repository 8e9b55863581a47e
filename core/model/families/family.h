// A model family: its description of the decoder (DecoderSpec) and its Hugging Face side — the
// config.json reader and writer, moepeak's names of its pieces and where each piece lives in the
// Hub's checkpoints (the Hub layout). One small file per family (mixtral.cpp, qwen3_moe.cpp,
// gpt_oss.cpp) defines one Family; nothing else in the model names a family. docs/models.md says
// what each supports.
//
//   const Family& f = family_of(ModelType::qwen3_moe);
//   DecoderSpec spec = f.describe(model);                     // throws on an unsupported field
//   f.tensor_name({Piece::expert_up, 3, 17});  // "model.layers.3.mlp.experts.17.up_proj.weight"
//   HubPlacement h = f.hub_placement(spec, {Piece::expert_up, 3, 17}, {I, H});  // the same tensor
//   nlohmann::json j = f.to_hf_config(model, "bfloat16");     // transformers loads it
//   ModelConfig m = f.from_hf_config(j, "ckpt/config.json");
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"
#include "core/model/decoder_spec.h"

namespace moepeak {

// The parameters of a decoder, as pieces. Layer pieces carry their layer, expert pieces their
// expert too.
enum class Piece {
  embed,             // (V, H)
  input_norm,        // (H)
  q,                 // (nh d, H)
  k,                 // (nkv d, H)
  v,                 // (nkv d, H)
  o,                 // (H, nh d)
  q_bias,            // (nh d)
  k_bias,            // (nkv d)
  v_bias,            // (nkv d)
  o_bias,            // (H)
  sinks,             // (nh)
  q_norm,            // (d)
  k_norm,            // (d)
  post_norm,         // (H)
  router,            // (E, H)
  router_bias,       // (E)
  expert_gate,       // (I, H)   w1 of ExpertWeights
  expert_up,         // (I, H)   w3
  expert_down,       // (H, I)   w2
  expert_gate_bias,  // (I)   b1
  expert_up_bias,    // (I)   b3
  expert_down_bias,  // (H)   b2
  dense_gate,        // (I, H)
  dense_up,          // (I, H)
  dense_down,        // (H, I)
  // Latent attention (AttentionKind::latent; d = nope + rope, r_q, r_kv the latent ranks):
  q_a,                     // (r_q, H)
  q_a_norm,                // (r_q)
  q_b,                     // (nh d, r_q)   (q (nh d, H) when r_q = 0)
  kv_a,                    // (r_kv + rope, H)
  kv_a_norm,               // (r_kv)
  kv_b,                    // (nh (nope + dv), r_kv)
  router_correction_bias,  // (E)   e_score_correction_bias: the choice's bias, not trained
  shared_gate,             // (Is, H)   the shared experts' SwiGLU, Is = shared_intermediate
  shared_up,               // (Is, H)
  shared_down,             // (H, Is)
  final_norm,              // (H)
  lm_head,                 // (V, H)
};

struct PieceRef {
  Piece piece;
  int layer = -1;
  int expert = -1;
};

// The Hub layout: where a parameter (a piece, as moepeak keeps it) lives in the family's Hugging
// Face checkpoints. Inside Hub tensor `tensor` of shape `shape`, the param's element
// (i_0, ..., i_{n-1}) (row-major over the param's own shape) is the Hub tensor's row-major element
//     offset + i_0 * strides[0] + ... + i_{n-1} * strides[n-1].
// Most params are a Hub tensor of their own (whole_hub_tensor: offset 0, the param's shape,
// row-major strides); the import, the export and the step dump then copy it as it is. gpt-oss
// fuses a layer's experts (transformers' GptOssExperts), so expert e of E, width I, hidden H is
//     gate w1 (I, H)  in mlp.experts.gate_up_proj (E, H, 2I)  offset e*H*2I      strides {2, 2I}
//     up   w3 (I, H)  in the same                             offset e*H*2I + 1  strides {2, 2I}
//     down w2 (H, I)  in mlp.experts.down_proj (E, I, H)      offset e*I*H       strides {1, H}
//     b1 (I), b3 (I)  in mlp.experts.gate_up_proj_bias (E, 2I)  e*2I, e*2I + 1   strides {2}
//     b2 (H)          in mlp.experts.down_proj_bias (E, H)      e*H              strides {1}
// (gate_up_proj[e, h, 2i] = w1[i, h], gate_up_proj[e, h, 2i + 1] = w3[i, h], down_proj[e, i, h] =
// w2[h, i]: the x @ W orientation, gate and up in alternate columns).
// NOTES: what the readers and writers rely on (HubLayout, core/model/hub_layout.h, checks it):
//   - the params placed in one Hub tensor fill it exactly (their elements add up to its size and
//     each placement stays inside it);
//   - a placement is nested: its strides, sorted decreasing, are each at least the next one
//     times that one's extent, so walking the param's dims in that order visits increasing Hub
//     elements (an import reads the Hub tensor front to back, an export writes it so);
//   - the largest-stride dim moves along the Hub tensor's rows: one value of it lies within one
//     row of the Hub tensor's last dim (an export assembles whole rows).
// `mxfp4`: the family's released checkpoints may hold this Hub tensor X as MXFP4, X_blocks and
// X_scales (core/checkpoint/mxfp4.h) whose decoded [..., rows, cols] is X with its last two dims
// swapped — gpt-oss's gate_up_proj and down_proj.
struct HubPlacement {
  std::string tensor;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  std::vector<int64_t> strides;  // one per dim of the param
  bool mxfp4 = false;
  bool operator==(const HubPlacement&) const = default;
};

struct Family {
  ModelType type;
  std::string_view model_type;    // config.json's "model_type"
  std::string_view architecture;  // config.json's "architectures"[0]
  // The decoder this config describes; throws moepeak::Error naming the [model] key of a field
  // the family does not support.
  DecoderSpec (*describe)(const ModelConfig& model);
  // moepeak's name of a piece ("model.layers.0.self_attn.q_proj.weight"): the Hub's name where the
  // piece is a Hub tensor of its own; gpt-oss's experts are named per expert
  // ("model.layers.0.mlp.experts.3.gate_proj.weight") inside moepeak's checkpoints.
  std::string (*tensor_name)(const PieceRef& ref);
  // config.json as transformers writes it for this family (both transformers 4's and 5's RoPE
  // fields); `dtype` is the torch spelling of the weights' dtype.
  nlohmann::json (*to_hf_config)(const ModelConfig& model, std::string_view dtype);
  // config.json read back; throws moepeak::Error naming `source` and the field when a field is
  // missing, of the wrong type, or describes what the family does not implement.
  ModelConfig (*from_hf_config)(const nlohmann::json& json, const std::string& source);
  // Where the piece `ref` of shape `dims` (the ParamLayout's) lives in the Hub's checkpoints of
  // the decoder `spec` (see HubPlacement).
  HubPlacement (*hub_placement)(const DecoderSpec& spec, const PieceRef& ref,
                                const std::vector<int64_t>& dims);
  // The modules a released MXFP4 checkpoint of the family leaves unquantised, as its config.json's
  // quantization_config.modules_to_not_convert lists them (`moepeak export --quantize mxfp4`
  // writes them); empty for a family without MXFP4 tensors.
  std::span<const std::string_view> mxfp4_modules_to_not_convert;
  // Other model_type values whose config.json this family reads with its own semantics (Kimi-K2's
  // "kimi_k2" for deepseek_v3); its export writes `model_type`.
  std::span<const std::string_view> model_type_aliases = {};
};

const Family& family_of(ModelType type);
// The family config.json's model_type names; throws moepeak::Error naming `source`, the value and
// the supported families when it is none of them.
const Family& family_named(std::string_view model_type, const std::string& source);
std::span<const Family* const> all_families();

// What families share (family.cpp): the Llama-style Hub names of the embedding, the norms, the
// attention projections, their biases, norms and sinks, a dense MLP and the head
// ("model.layers.{l}.self_attn.q_proj.weight", "...q_proj.bias", "...self_attn.sinks",
// "model.layers.{l}.mlp.gate_proj.weight", "lm_head.weight"); throws for an expert or a router,
// whose names are each family's.
std::string llama_tensor_name(const PieceRef& ref);
// The placement of a param that is a Hub tensor of its own, named `tensor`: offset 0, shape
// `dims`, row-major strides.
HubPlacement whole_hub_tensor(std::string tensor, const std::vector<int64_t>& dims);
// The description's parts every family fills alike: vocab, hidden, eps, RoPE, the tied head, the
// aux-loss coefficient, and one grouped-query attention per layer (layers without their MLP).
DecoderSpec shared_decoder_spec(const ModelConfig& model);
// Throws moepeak::Error "model.KEY = VALUE: the FAMILY family WHY" for a [model] setting the family
// cannot take.
[[noreturn]] void unsupported_setting(const ModelConfig& model, std::string_view key,
                                      std::string_view why);

// Throws unsupported_setting for the [model] keys of gpt-oss's attention and experts
// (layer_types, sliding_window, swiglu_limit, swiglu_alpha) set to other than their defaults, for
// a family whose layers all attend fully and whose experts are plain SwiGLU.
void require_full_attention_and_swiglu(const ModelConfig& model);
// Throws unsupported_setting for qwen3_moe's dense-layer keys (moe_intermediate_size other than
// intermediate_size, mlp_only_layers, decoder_sparse_step), for a family with experts of
// intermediate_size in every layer.
void require_experts_in_every_layer(const ModelConfig& model);
// Throws unsupported_setting for deepseek_v3's keys (the latent attention's, the group routing's,
// shared experts, dense first layers, the balancing rate, MTP layers, interleaved RoPE) set to
// other than their defaults, for every other family.
void require_no_deepseek_fields(const ModelConfig& model);

// Each family's, defined in its file.
const Family& mixtral_family();
const Family& qwen3_moe_family();
const Family& gpt_oss_family();
const Family& deepseek_v3_family();

}  // namespace moepeak
