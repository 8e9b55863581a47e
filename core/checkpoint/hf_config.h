// The Hugging Face `config.json` of a checkpoint: ModelConfig <-> MixtralConfig JSON, so that a
// moepeak checkpoint directory loads with transformers' MixtralForCausalLM
// (docs/design.md#the-model).
//
//   write_config_json("ckpt/step_100/config.json", cfg.model, DType::bf16);   // atomically
//   ModelConfig m = model_config_from_json(json, "ckpt/step_100/config.json");
//
// Written fields: architectures ["MixtralForCausalLM"], model_type "mixtral", the ModelConfig
// fields under their own (MixtralConfig) names with head_dim resolved (0 is written as
// hidden_size / num_attention_heads), output_router_logits (router_aux_loss_coef > 0),
// tie_word_embeddings false, hidden_act "silu", attention_dropout 0.0, sliding_window null,
// torch_dtype and dtype (transformers 4's and 5's names) = `dtype`, rope_theta both at the top
// level (transformers 4) and in rope_parameters {rope_type "default"} (transformers 5).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/config/config.h"
#include "core/runtime/dtype.h"

namespace moepeak {

// dtype: the torch spelling of the weights' dtype ("float32", "bfloat16").
nlohmann::json mixtral_config_json(const ModelConfig& model, std::string_view dtype = "float32");

// Reads a MixtralConfig JSON. Required: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, num_local_experts,
// num_experts_per_tok, max_position_embeddings, rope_theta (or, as transformers 5 writes it,
// rope_parameters.rope_theta), rms_norm_eps. Optional, with
// transformers' defaults: head_dim (missing or null = derived), initializer_range (0.02),
// router_aux_loss_coef (counts only when output_router_logits is true, as in transformers;
// otherwise 0). Throws moepeak::Error naming `source` and the field when a field is missing or of
// the wrong type, and when the JSON describes something this model does not implement
// (model_type other than "mixtral", hidden_act other than "silu", tied embeddings, a sliding
// window shorter than max_position_embeddings, a rope_scaling or rope_parameters.rope_type other
// than none/"default"). torch_dtype / dtype are not read: tensors carry their own dtype.
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source);

// The torch spelling of a weight dtype: "float32", "bfloat16", "float64".
std::string_view torch_dtype_name(DType dtype);
// Writes mixtral_config_json(model, the torch name of `weights`: the dtype the weights beside it
// are written in), indented, atomically.
void write_config_json(const std::string& path, const ModelConfig& model, DType weights);

// The JSON document in `path`; throws moepeak::Error naming the path when it cannot be opened or
// is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

// Reads and parses `path` with model_config_from_json; throws moepeak::Error naming the path.
ModelConfig read_config_json(const std::string& path);

}  // namespace moepeak
