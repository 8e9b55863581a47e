// hf_fields: typed config.json fields and the RoPE fields of both transformers forms (see
// hf_fields.h).
#include "core/model/families/hf_fields.h"

#include <array>
#include <string_view>

#include "core/error.h"

namespace moepeak::hf_fields {

std::string describe(const nlohmann::json& value) {
  return detail::concat(value.type_name(), " ", value.dump());
}

const nlohmann::json* optional(const nlohmann::json& json, const char* field) {
  auto it = json.find(field);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

namespace {

const nlohmann::json& required(const nlohmann::json& json, const std::string& source,
                               const char* field) {
  const nlohmann::json* value = optional(json, field);
  if (!value) MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is missing");
  return *value;
}

int64_t as_integer(const nlohmann::json& value, const std::string& source, const char* field) {
  if (!value.is_number_integer()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be an integer, got ",
                        describe(value));
  }
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is out of range: ", value.dump());
  }
  return value.get<int64_t>();
}

double as_number(const nlohmann::json& value, const std::string& source, const char* field) {
  if (!value.is_number()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be a number, got ", describe(value));
  }
  return value.get<double>();
}

bool as_boolean(const nlohmann::json& value, const std::string& source, const char* field) {
  if (!value.is_boolean()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be a boolean, got ", describe(value));
  }
  return value.get<bool>();
}

}  // namespace

int64_t required_integer(const nlohmann::json& json, const std::string& source, const char* field) {
  return as_integer(required(json, source, field), source, field);
}

double required_number(const nlohmann::json& json, const std::string& source, const char* field) {
  return as_number(required(json, source, field), source, field);
}

int64_t integer_or(const nlohmann::json& json, const std::string& source, const char* field,
                   int64_t fallback) {
  const nlohmann::json* value = optional(json, field);
  return value ? as_integer(*value, source, field) : fallback;
}

double number_or(const nlohmann::json& json, const std::string& source, const char* field,
                 double fallback) {
  const nlohmann::json* value = optional(json, field);
  return value ? as_number(*value, source, field) : fallback;
}

bool boolean_or(const nlohmann::json& json, const std::string& source, const char* field,
                bool fallback) {
  const nlohmann::json* value = optional(json, field);
  return value ? as_boolean(*value, source, field) : fallback;
}

void expect_string(const nlohmann::json& json, const std::string& source, const char* field,
                   const char* expected, const char* why) {
  const nlohmann::json* value = optional(json, field);
  if (value && !(value->is_string() && value->get<std::string>() == expected)) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is ", value->dump(), "; ", why);
  }
}

void expect_boolean(const nlohmann::json& json, const std::string& source, const char* field,
                    bool expected, const char* why) {
  const nlohmann::json* value = optional(json, field);
  if (value && as_boolean(*value, source, field) != expected) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is ", value->dump(), "; ", why);
  }
}

// ---- RoPE ------------------------------------------------------------------------------------

namespace {

// Keys a RoPE dictionary may hold (both forms); anything else is an error, since an unknown
// parameter may change the frequencies.
constexpr std::array<std::string_view, 14> kRopeKeys = {
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "truncate",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "low_freq_factor",
    "high_freq_factor",
    "partial_rotary_factor",
};

// One RoPE dictionary (`field` is "rope_scaling" or "rope_parameters") into `m`'s rope_* fields.
void read_rope_dict(const nlohmann::json& rope, const std::string& source, const std::string& field,
                    ModelConfig& m) {
  if (!rope.is_object()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be an object or null, got ",
                        describe(rope));
  }
  auto key = [&](const char* k) { return field + "." + k; };
  for (const auto& [k, v] : rope.items()) {
    bool known = false;
    for (std::string_view name : kRopeKeys) known = known || name == k;
    if (!known) {
      MOEPEAK_INPUT_ERROR(source, ": field \"", field, ".", k,
                          "\" is not a RoPE parameter moepeak ",
                          "implements (docs/models.md#extending-the-context)");
    }
  }
  const nlohmann::json* type = optional(rope, "rope_type");
  const char* type_key = "rope_type";
  if (!type) {
    type = optional(rope, "type");  // transformers 4's older spelling
    type_key = "type";
  }
  std::string name = "default";
  if (type) {
    if (!type->is_string()) {
      MOEPEAK_INPUT_ERROR(source, ": field \"", key(type_key), "\" must be a string, got ",
                          describe(*type));
    }
    name = type->get<std::string>();
  }
  const auto parsed = enum_from_name<RopeType>(name);
  if (!parsed) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", key(type_key), "\" is \"", name,
                        "\"; moepeak implements the RoPE types default, linear, dynamic, yarn and "
                        "llama3");
  }
  m.rope_type = *parsed;
  const std::string fk = key("partial_rotary_factor");
  if (number_or(rope, source, fk.c_str(), 1.0) != 1.0) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", fk, "\" is ", rope["partial_rotary_factor"].dump(),
                        "; partial rotary embeddings are not implemented for this family");
  }
  auto number = [&](const char* k, double fallback) {
    const nlohmann::json* v = optional(rope, k);
    return v ? as_number(*v, source, key(k).c_str()) : fallback;
  };
  const nlohmann::json* orig = optional(rope, "original_max_position_embeddings");
  m.rope_original_max_position_embeddings =
      orig ? as_integer(*orig, source, key("original_max_position_embeddings").c_str()) : 0;
  m.rope_factor = number("factor", 1.0);
  m.rope_beta_fast = number("beta_fast", 32.0);
  m.rope_beta_slow = number("beta_slow", 1.0);
  m.rope_mscale = number("mscale", 0.0);
  m.rope_mscale_all_dim = number("mscale_all_dim", 0.0);
  m.rope_attention_factor = number("attention_factor", 0.0);
  m.rope_low_freq_factor = number("low_freq_factor", 1.0);
  m.rope_high_freq_factor = number("high_freq_factor", 4.0);
  const nlohmann::json* truncate = optional(rope, "truncate");
  m.rope_truncate = truncate ? as_boolean(*truncate, source, key("truncate").c_str()) : true;
  if (m.rope_type != RopeType::default_rope && m.rope_type != RopeType::yarn &&
      !optional(rope, "factor")) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", key("factor"), "\" is missing (rope_type \"", name,
                        "\" needs it)");
  }
}

}  // namespace

void read_rope(const nlohmann::json& json, const std::string& source, ModelConfig& m) {
  // NOTES: transformers 4 reads rope_scaling alone; 5 takes a non-empty rope_scaling over
  // rope_parameters. So does moepeak: rope_parameters describes the scaling only without one.
  const nlohmann::json* scaling = optional(json, "rope_scaling");
  if (scaling && scaling->is_object() && scaling->empty()) scaling = nullptr;
  const nlohmann::json* params = optional(json, "rope_parameters");
  if (scaling) {
    read_rope_dict(*scaling, source, "rope_scaling", m);
  } else if (params) {
    read_rope_dict(*params, source, "rope_parameters", m);
  }

  // NOTES: a rope_theta that is present but null is a type error, not an absent field.
  auto it = json.find("rope_theta");
  const nlohmann::json* top = it == json.end() ? nullptr : &*it;
  const nlohmann::json* nested = params ? optional(*params, "rope_theta") : nullptr;
  if (!top && !nested) {
    MOEPEAK_INPUT_ERROR(source,
                        ": field \"rope_theta\" is missing (neither at the top level nor in "
                        "\"rope_parameters\")");
  }
  const double theta = top ? as_number(*top, source, "rope_theta")
                           : as_number(*nested, source, "rope_parameters.rope_theta");
  if (top && nested && as_number(*nested, source, "rope_parameters.rope_theta") != theta) {
    MOEPEAK_INPUT_ERROR(source, ": \"rope_theta\" ", top->dump(),
                        " and \"rope_parameters.rope_theta\" ", nested->dump(), " disagree");
  }
  m.rope_theta = theta;
  // transformers 5 lets a top-level original_max_position_embeddings override the dictionary's.
  if (m.rope_type == RopeType::yarn || m.rope_type == RopeType::llama3) {
    m.rope_original_max_position_embeddings = integer_or(
        json, source, "original_max_position_embeddings", m.rope_original_max_position_embeddings);
  }
  // yarn without a factor: transformers takes max_position_embeddings / the original context.
  if (m.rope_type == RopeType::yarn) {
    const nlohmann::json& dict = scaling ? *scaling : *params;
    if (!optional(dict, "factor")) {
      if (m.rope_original_max_position_embeddings <= 0) {
        MOEPEAK_INPUT_ERROR(source,
                            ": rope_type \"yarn\" needs \"factor\" or "
                            "\"original_max_position_embeddings\"");
      }
      m.rope_factor = static_cast<double>(m.max_position_embeddings) /
                      static_cast<double>(m.rope_original_max_position_embeddings);
    }
  }
}

void write_rope(const ModelConfig& m, nlohmann::json& json) {
  json["rope_theta"] = m.rope_theta;
  nlohmann::json params = {{"rope_type", std::string(enum_name(m.rope_type))},
                           {"rope_theta", m.rope_theta}};
  if (m.rope_type == RopeType::default_rope) {  // transformers 4 reads an absent rope_scaling
    json["rope_parameters"] = params;
    return;
  }
  nlohmann::json scaling = {{"rope_type", std::string(enum_name(m.rope_type))},
                            {"factor", m.rope_factor}};
  const auto orig = m.rope_original_max_position_embeddings;
  switch (m.rope_type) {
    case RopeType::default_rope:
    case RopeType::linear:
    case RopeType::dynamic:
      break;
    case RopeType::yarn:
      if (orig > 0) scaling["original_max_position_embeddings"] = orig;
      scaling["beta_fast"] = m.rope_beta_fast;
      scaling["beta_slow"] = m.rope_beta_slow;
      scaling["truncate"] = m.rope_truncate;
      if (m.rope_mscale > 0) scaling["mscale"] = m.rope_mscale;
      if (m.rope_mscale_all_dim > 0) scaling["mscale_all_dim"] = m.rope_mscale_all_dim;
      if (m.rope_attention_factor > 0) scaling["attention_factor"] = m.rope_attention_factor;
      break;
    case RopeType::llama3:
      scaling["original_max_position_embeddings"] = orig;
      scaling["low_freq_factor"] = m.rope_low_freq_factor;
      scaling["high_freq_factor"] = m.rope_high_freq_factor;
      break;
  }
  for (const auto& [k, v] : scaling.items()) params[k] = v;
  json["rope_scaling"] = scaling;
  json["rope_parameters"] = params;
}

// ---- The shared fields --------------------------------------------------------------------

namespace {

// "eos_token_id": an id, a list of ids (the first ends a document; transformers stops generating
// at any), or null / absent (-1).
int64_t read_eos_token_id(const nlohmann::json& json, const std::string& source) {
  const auto it = json.find("eos_token_id");
  if (it == json.end() || it->is_null()) return -1;
  const nlohmann::json& first = it->is_array() && !it->empty() ? it->at(0) : *it;
  if (!first.is_number_integer() || first.get<int64_t>() < 0) {
    MOEPEAK_INPUT_ERROR(source, ": eos_token_id is ", it->dump(),
                        ", expected a token id or a list of them");
  }
  return first.get<int64_t>();
}

}  // namespace

void read_shared(const nlohmann::json& json, const std::string& source, ModelConfig& m) {
  expect_string(json, source, "hidden_act", "silu", "only \"silu\" is implemented");
  m.vocab_size = required_integer(json, source, "vocab_size");
  m.hidden_size = required_integer(json, source, "hidden_size");
  m.intermediate_size = required_integer(json, source, "intermediate_size");
  m.num_hidden_layers = required_integer(json, source, "num_hidden_layers");
  m.num_attention_heads = required_integer(json, source, "num_attention_heads");
  m.num_key_value_heads = required_integer(json, source, "num_key_value_heads");
  m.max_position_embeddings = required_integer(json, source, "max_position_embeddings");
  read_rope(json, source, m);
  m.rms_norm_eps = required_number(json, source, "rms_norm_eps");
  m.head_dim = integer_or(json, source, "head_dim", 0);
  m.initializer_range = number_or(json, source, "initializer_range", 0.02);
  m.tie_word_embeddings = boolean_or(json, source, "tie_word_embeddings", false);
  m.eos_token_id = read_eos_token_id(json, source);
}

void write_shared(const ModelConfig& m, std::string_view architecture, std::string_view model_type,
                  std::string_view dtype, nlohmann::json& j) {
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_hidden_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_key_value_heads;
  j["head_dim"] = m.head_dim_resolved();
  j["max_position_embeddings"] = m.max_position_embeddings;
  write_rope(m, j);
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  if (m.eos_token_id >= 0) j["eos_token_id"] = m.eos_token_id;
  j["hidden_act"] = "silu";
  j["initializer_range"] = m.initializer_range;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = dtype;
  j["dtype"] = dtype;
}

double read_aux_loss_coef(const nlohmann::json& json, const std::string& source) {
  const bool output_router_logits = boolean_or(json, source, "output_router_logits", false);
  const double coef = number_or(json, source, "router_aux_loss_coef", 0.0);
  return output_router_logits ? coef : 0.0;
}

}  // namespace moepeak::hf_fields
