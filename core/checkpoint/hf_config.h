// The Hugging Face `config.json` of a checkpoint: ModelConfig <-> the JSON its family writes
// (core/model/families/), so that a moepeak checkpoint directory loads with transformers'
// <Family>ForCausalLM and a Hub checkpoint starts a run.
//
//   write_config_json("ckpt/step_100/config.json", cfg.model, DType::bf16);   // atomically
//   ModelConfig m = model_config_from_json(json, "ckpt/step_100/config.json");
//
// Written fields (every family): architectures, model_type, the shapes under their
// transformers names with head_dim resolved (0 is written as hidden_size / num_attention_heads),
// tie_word_embeddings, hidden_act "silu", attention_dropout 0.0, torch_dtype and dtype
// (transformers 4's and 5's names) = `dtype`, rope_theta both at the top level (transformers 4)
// and in rope_parameters (transformers 5) with the RoPE scaling in both rope_scaling and
// rope_parameters; then the family's own (Mixtral: num_local_experts, output_router_logits
// (router_aux_loss_coef > 0), sliding_window null; Qwen3-MoE: num_experts,
// moe_intermediate_size, decoder_sparse_step, mlp_only_layers, norm_topk_prob, ...).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/config/config.h"
#include "core/runtime/dtype.h"

namespace moepeak {

// dtype: the torch spelling of the weights' dtype ("float32", "bfloat16"). The family is
// model.model_type's; mixtral_config_json writes Mixtral's whatever model_type says.
nlohmann::json model_config_json(const ModelConfig& model, std::string_view dtype = "float32");
nlohmann::json mixtral_config_json(const ModelConfig& model, std::string_view dtype = "float32");

// Reads a config.json by its model_type (absent = "mixtral", as older Mixtral files are).
// Required: vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, max_position_embeddings, rope_theta (or, as transformers 5 writes it,
// rope_parameters.rope_theta), rms_norm_eps, and the family's expert fields. Optional, with
// transformers' defaults: head_dim (missing or null = derived), initializer_range (0.02),
// tie_word_embeddings (false), router_aux_loss_coef (counts only when output_router_logits is
// true, as in transformers; otherwise 0), the RoPE scaling (default, linear, dynamic, yarn,
// llama3). Throws moepeak::Error naming `source` and the field when a field is missing or of the
// wrong type, and when the JSON describes something moepeak does not implement (an unknown
// model_type, hidden_act other than "silu", another RoPE type, a sliding window, q/k/v/o biases).
// torch_dtype / dtype are not read: tensors carry their own dtype.
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source);

// The torch spelling of a weight dtype: "float32", "bfloat16", "float64".
std::string_view torch_dtype_name(DType dtype);
// Writes model_config_json(model, the torch name of `weights`: the dtype the weights beside it
// are written in), indented, atomically.
void write_config_json(const std::string& path, const ModelConfig& model, DType weights);

// The JSON document in `path`; throws moepeak::Error naming the path when it cannot be opened or
// is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

// Reads and parses `path` with model_config_from_json; throws moepeak::Error naming the path.
ModelConfig read_config_json(const std::string& path);

}  // namespace moepeak
