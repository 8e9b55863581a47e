// ModelConfig <-> a Hugging Face config.json, by the model family (see hf_config.h).
#include "core/checkpoint/hf_config.h"

#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/families/hf_fields.h"

namespace moepeak {

nlohmann::json model_config_json(const ModelConfig& model, std::string_view dtype) {
  return family_of(model.model_type).to_hf_config(model, dtype);
}

nlohmann::json mixtral_config_json(const ModelConfig& model, std::string_view dtype) {
  ModelConfig mixtral = model;
  mixtral.model_type = ModelType::mixtral;
  return mixtral_family().to_hf_config(mixtral, dtype);
}

ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object())
    MOEPEAK_INPUT_ERROR(source, ": expected a JSON object, got ", json.type_name());
  // NOTES: an old Mixtral config.json may lack model_type; transformers' AutoConfig needs it, but
  // moepeak has always read such files as Mixtral's.
  std::string model_type = "mixtral";
  if (auto it = json.find("model_type"); it != json.end()) {
    if (!it->is_string()) {
      MOEPEAK_INPUT_ERROR(source, ": field \"model_type\" must be a string, got ",
                          hf_fields::describe(*it));
    }
    model_type = it->get<std::string>();
  }
  return family_named(model_type, source).from_hf_config(json, source);
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
  write_file_atomically(path, model_config_json(model, torch_dtype_name(weights)).dump(2) + "\n");
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
