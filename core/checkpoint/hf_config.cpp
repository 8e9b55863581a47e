// ModelConfig <-> Hugging Face MixtralConfig config.json (field list in hf_config.h).
#include "core/checkpoint/hf_config.h"

#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace moepeak {

namespace {

std::string json_type_and_value(const nlohmann::json& value) {
  return detail::concat(value.type_name(), " ", value.dump());
}

const nlohmann::json& required_field(const nlohmann::json& json, const std::string& source,
                                     const char* field) {
  auto it = json.find(field);
  if (it == json.end()) MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is missing");
  return *it;
}

int64_t integer_field(const nlohmann::json& value, const std::string& source, const char* field) {
  if (!value.is_number_integer()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be an integer, got ",
                        json_type_and_value(value));
  }
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is out of range: ", value.dump());
  }
  return value.get<int64_t>();
}

double number_field(const nlohmann::json& value, const std::string& source, const char* field) {
  if (!value.is_number()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be a number, got ",
                        json_type_and_value(value));
  }
  return value.get<double>();
}

int64_t required_integer(const nlohmann::json& json, const std::string& source, const char* field) {
  return integer_field(required_field(json, source, field), source, field);
}

double required_number(const nlohmann::json& json, const std::string& source, const char* field) {
  return number_field(required_field(json, source, field), source, field);
}

// The field's value, or nullptr when it is absent.
const nlohmann::json* optional_field(const nlohmann::json& json, const char* field) {
  auto it = json.find(field);
  return it == json.end() ? nullptr : &*it;
}

// A rope dictionary (transformers 4's rope_scaling, 5's rope_parameters) must describe plain RoPE.
void check_default_rope(const nlohmann::json& rope, const std::string& source, const char* field) {
  if (rope.is_null()) return;
  if (!rope.is_object()) {
    MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" must be an object or null, got ",
                        json_type_and_value(rope));
  }
  for (const char* kind : {"rope_type", "type"}) {
    const nlohmann::json* type = optional_field(rope, kind);
    if (type && !(type->is_string() && type->get<std::string>() == "default")) {
      MOEPEAK_INPUT_ERROR(source, ": field \"", field, ".", kind, "\" is ", type->dump(),
                          "; only the default RoPE is implemented (no scaling)");
    }
  }
}

// rope_theta at the top level (transformers 4) or in rope_parameters (transformers 5).
double rope_theta_of(const nlohmann::json& json, const std::string& source) {
  if (const nlohmann::json* scaling = optional_field(json, "rope_scaling"))
    check_default_rope(*scaling, source, "rope_scaling");
  const nlohmann::json* top = optional_field(json, "rope_theta");
  const nlohmann::json* params = optional_field(json, "rope_parameters");
  if (params) check_default_rope(*params, source, "rope_parameters");
  const nlohmann::json* nested =
      params && params->is_object() ? optional_field(*params, "rope_theta") : nullptr;
  if (!top && !nested) {
    MOEPEAK_INPUT_ERROR(source,
                        ": field \"rope_theta\" is missing (neither at the top level nor in "
                        "\"rope_parameters\")");
  }
  const double theta = top ? number_field(*top, source, "rope_theta")
                           : number_field(*nested, source, "rope_parameters.rope_theta");
  if (top && nested && number_field(*nested, source, "rope_parameters.rope_theta") != theta) {
    MOEPEAK_INPUT_ERROR(source, ": \"rope_theta\" ", top->dump(),
                        " and \"rope_parameters.rope_theta\" ", nested->dump(), " disagree");
  }
  return theta;
}

}  // namespace

nlohmann::json mixtral_config_json(const ModelConfig& model, std::string_view dtype) {
  nlohmann::json j;
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["vocab_size"] = model.vocab_size;
  j["hidden_size"] = model.hidden_size;
  j["intermediate_size"] = model.intermediate_size;
  j["num_hidden_layers"] = model.num_hidden_layers;
  j["num_attention_heads"] = model.num_attention_heads;
  j["num_key_value_heads"] = model.num_key_value_heads;
  j["head_dim"] = model.head_dim_resolved();
  j["num_local_experts"] = model.num_local_experts;
  j["num_experts_per_tok"] = model.num_experts_per_tok;
  j["max_position_embeddings"] = model.max_position_embeddings;
  j["rope_theta"] = model.rope_theta;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", model.rope_theta}};
  j["rms_norm_eps"] = model.rms_norm_eps;
  j["router_aux_loss_coef"] = model.router_aux_loss_coef;
  j["output_router_logits"] = model.router_aux_loss_coef > 0;
  j["tie_word_embeddings"] = false;
  j["hidden_act"] = "silu";
  j["initializer_range"] = model.initializer_range;
  j["attention_dropout"] = 0.0;
  j["sliding_window"] = nullptr;
  j["torch_dtype"] = dtype;
  j["dtype"] = dtype;
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object())
    MOEPEAK_INPUT_ERROR(source, ": expected a JSON object, got ", json.type_name());

  if (const nlohmann::json* type = optional_field(json, "model_type")) {
    if (!type->is_string() || type->get<std::string>() != "mixtral") {
      MOEPEAK_INPUT_ERROR(source, ": field \"model_type\" is ", type->dump(),
                          ", expected \"mixtral\"");
    }
  }
  if (const nlohmann::json* act = optional_field(json, "hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      MOEPEAK_INPUT_ERROR(source, ": field \"hidden_act\" is ", act->dump(),
                          ", only \"silu\" is implemented");
    }
  }
  if (const nlohmann::json* tied = optional_field(json, "tie_word_embeddings")) {
    if (!tied->is_boolean()) {
      MOEPEAK_INPUT_ERROR(source, ": field \"tie_word_embeddings\" must be a boolean, got ",
                          json_type_and_value(*tied));
    }
    if (tied->get<bool>())
      MOEPEAK_INPUT_ERROR(
          source, ": field \"tie_word_embeddings\" is true, the model has an untied LM head");
  }

  ModelConfig m;
  m.vocab_size = required_integer(json, source, "vocab_size");
  m.hidden_size = required_integer(json, source, "hidden_size");
  m.intermediate_size = required_integer(json, source, "intermediate_size");
  m.num_hidden_layers = required_integer(json, source, "num_hidden_layers");
  m.num_attention_heads = required_integer(json, source, "num_attention_heads");
  m.num_key_value_heads = required_integer(json, source, "num_key_value_heads");
  m.num_local_experts = required_integer(json, source, "num_local_experts");
  m.num_experts_per_tok = required_integer(json, source, "num_experts_per_tok");
  m.max_position_embeddings = required_integer(json, source, "max_position_embeddings");
  m.rope_theta = rope_theta_of(json, source);
  m.rms_norm_eps = required_number(json, source, "rms_norm_eps");

  m.head_dim = 0;
  if (const nlohmann::json* head_dim = optional_field(json, "head_dim");
      head_dim && !head_dim->is_null()) {
    m.head_dim = integer_field(*head_dim, source, "head_dim");
  }
  m.initializer_range = 0.02;
  if (const nlohmann::json* range = optional_field(json, "initializer_range")) {
    m.initializer_range = number_field(*range, source, "initializer_range");
  }
  bool output_router_logits = false;
  if (const nlohmann::json* flag = optional_field(json, "output_router_logits")) {
    if (!flag->is_boolean()) {
      MOEPEAK_INPUT_ERROR(source, ": field \"output_router_logits\" must be a boolean, got ",
                          json_type_and_value(*flag));
    }
    output_router_logits = flag->get<bool>();
  }
  m.router_aux_loss_coef = 0.0;
  if (const nlohmann::json* coef = optional_field(json, "router_aux_loss_coef")) {
    const double value = number_field(*coef, source, "router_aux_loss_coef");
    if (output_router_logits) m.router_aux_loss_coef = value;
  }
  if (const nlohmann::json* window = optional_field(json, "sliding_window");
      window && !window->is_null()) {
    const int64_t w = integer_field(*window, source, "sliding_window");
    if (w < m.max_position_embeddings) {
      MOEPEAK_INPUT_ERROR(source, ": field \"sliding_window\" is ", w,
                          "; sliding-window attention is not implemented (null, or at least "
                          "max_position_embeddings ",
                          m.max_position_embeddings, ", is full attention)");
    }
  }
  return m;
}

std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bfloat16";
    case DType::f64:
      return "float64";
    case DType::f32:
      return "float32";
    default:
      MOEPEAK_THROW("torch_dtype_name: ", dtype_name(dtype), " is not a weight dtype");
  }
}

void write_config_json(const std::string& path, const ModelConfig& model, DType weights) {
  write_file_atomically(path, mixtral_config_json(model, torch_dtype_name(weights)).dump(2) + "\n");
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) MOEPEAK_INPUT_ERROR(path, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    MOEPEAK_INPUT_ERROR(path, ": not valid JSON: ", e.what());
  }
  return json;
}

ModelConfig read_config_json(const std::string& path) {
  return model_config_from_json(read_json_file(path), path);
}

}  // namespace moepeak
