// A model family: its description of the decoder (DecoderSpec) and its Hugging Face side — the
// config.json reader and writer and the Hub's tensor names of moepeak's pieces. One small file
// per family (mixtral.cpp, qwen3_moe.cpp) defines one Family; nothing else in the model names a
// family. docs/models.md says what each supports.
//
//   const Family& f = family_of(ModelType::qwen3_moe);
//   DecoderSpec spec = f.describe(model);                     // throws on an unsupported field
//   f.tensor_name({Piece::expert_up, 3, 17});  // "model.layers.3.mlp.experts.17.up_proj.weight"
//   nlohmann::json j = f.to_hf_config(model, "bfloat16");     // transformers loads it
//   ModelConfig m = f.from_hf_config(j, "ckpt/config.json");
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

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
  final_norm,        // (H)
  lm_head,           // (V, H)
};

struct PieceRef {
  Piece piece;
  int layer = -1;
  int expert = -1;
};

struct Family {
  ModelType type;
  std::string_view model_type;    // config.json's "model_type"
  std::string_view architecture;  // config.json's "architectures"[0]
  // The decoder this config describes; throws moepeak::Error naming the [model] key of a field
  // the family does not support.
  DecoderSpec (*describe)(const ModelConfig& model);
  // The Hub's name of a piece ("model.layers.0.self_attn.q_proj.weight").
  std::string (*tensor_name)(const PieceRef& ref);
  // config.json as transformers writes it for this family (both transformers 4's and 5's RoPE
  // fields); `dtype` is the torch spelling of the weights' dtype.
  nlohmann::json (*to_hf_config)(const ModelConfig& model, std::string_view dtype);
  // config.json read back; throws moepeak::Error naming `source` and the field when a field is
  // missing, of the wrong type, or describes what the family does not implement.
  ModelConfig (*from_hf_config)(const nlohmann::json& json, const std::string& source);
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

// Each family's, defined in its file.
const Family& mixtral_family();
const Family& qwen3_moe_family();
const Family& gpt_oss_family();

}  // namespace moepeak
