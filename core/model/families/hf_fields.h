// hf_fields: reading and writing the fields of a Hugging Face config.json that the families share
// — typed field access with errors naming the file and the field, and the RoPE fields in
// transformers 4's form (`rope_theta` + `rope_scaling`) and 5's (`rope_parameters`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/config/config.h"

namespace moepeak::hf_fields {

// The field's value, or nullptr when it is absent.
const nlohmann::json* optional(const nlohmann::json& json, const char* field);
// Each throws moepeak::Error "SOURCE: field \"F\" ..." when the field is missing (required_*) or of
// the wrong type (an optional field that is null reads as absent).
int64_t required_integer(const nlohmann::json& json, const std::string& source, const char* field);
double required_number(const nlohmann::json& json, const std::string& source, const char* field);
int64_t integer_or(const nlohmann::json& json, const std::string& source, const char* field,
                   int64_t fallback);
double number_or(const nlohmann::json& json, const std::string& source, const char* field,
                 double fallback);
bool boolean_or(const nlohmann::json& json, const std::string& source, const char* field,
                bool fallback);
// A string field that, when present, must be `expected` ("SOURCE: field \"hidden_act\" is
// \"gelu\"; only \"silu\" is implemented").
void expect_string(const nlohmann::json& json, const std::string& source, const char* field,
                   const char* expected, const char* why);
// A boolean field that, when present, must be `expected`.
void expect_boolean(const nlohmann::json& json, const std::string& source, const char* field,
                    bool expected, const char* why);
std::string describe(const nlohmann::json& value);  // "number 3.5", "string \"x\""

// rope_theta and the RoPE scaling into `model` (rope_theta, rope_type and the rope_* fields), from
// either form or both: a non-empty rope_scaling is the scaling, as transformers 4 and 5 read it;
// the two thetas must agree. Throws naming the field for a rope type other than
// default, linear, dynamic, yarn and llama3, a parameter of the wrong type, or a parameter moepeak
// does not implement (partial_rotary_factor other than 1, longrope's factors).
void read_rope(const nlohmann::json& json, const std::string& source, ModelConfig& model);
// Writes rope_theta, rope_parameters and, for a scaling, rope_scaling.
void write_rope(const ModelConfig& model, nlohmann::json& json);

// The fields every family shares (vocab_size, hidden_size, num_hidden_layers, the attention heads,
// head_dim (null or absent = derived), max_position_embeddings, rms_norm_eps, initializer_range
// (0.02), tie_word_embeddings (false), RoPE) into `model`; hidden_act must be "silu".
void read_shared(const nlohmann::json& json, const std::string& source, ModelConfig& model);
// The same written, with architectures, model_type, torch_dtype and dtype (transformers 4's and
// 5's names for the weights' dtype) and attention_dropout 0.
void write_shared(const ModelConfig& model, std::string_view architecture,
                  std::string_view model_type, std::string_view dtype, nlohmann::json& json);
// router_aux_loss_coef as transformers counts it: only with output_router_logits (else 0).
double read_aux_loss_coef(const nlohmann::json& json, const std::string& source);

}  // namespace moepeak::hf_fields
