// Hugging Face Mixtral checkpoints as a starting point: config merge and sliced weight reads
// (contract in hf_import.h).
#include "core/checkpoint/hf_import.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "core/checkpoint/hf_config.h"
#include "core/error.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Keys of [model] that are training choices, not properties of the weights (hf_import.h).
// Keys a run may set apart from the checkpoint's config.json: the loss and the initialisation,
// and the context — extending a pretrained model's context is setting RoPE scaling
// (model.rope_*) and the new max_position_embeddings over the weights it was trained with
// (docs/models.md#extending-the-context).
bool is_training_choice(const std::string& key) {
  return key == "model.router_aux_loss_coef" || key == "model.initializer_range" ||
         key == "model.max_position_embeddings" || key == "model.rope_type" ||
         (key.rfind("model.rope_", 0) == 0 && key != "model.rope_theta");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ")";
  return out.str();
}

}  // namespace

Config with_init_from_model(const Config& cfg) {
  if (cfg.model.init_from.empty()) return cfg;
  const std::string& dir = cfg.model.init_from;
  if (!fs::is_directory(dir)) {
    MOEPEAK_INPUT_ERROR("model.init_from = \"", dir, "\" (", cfg.origin("model.init_from"),
                        ") is not a directory");
  }
  const std::string source = (fs::path(dir) / "config.json").string();
  if (!fs::exists(source)) {
    MOEPEAK_INPUT_ERROR("model.init_from: ", dir,
                        " has no config.json (a Hugging Face checkpoint directory has one)");
  }
  Config theirs = cfg;
  theirs.model = read_config_json(source);
  theirs.model.init_from = cfg.model.init_from;

  Config merged = cfg;
  for (const std::string& key : config_keys()) {
    if (key.rfind("model.", 0) != 0 || key == "model.init_from") continue;
    const std::string origin = cfg.origin(key);
    const bool user_set = cfg.origins.count(key) != 0 && origin != source;
    const std::string hf_value = config_value_toml(theirs, key);
    if (user_set) {
      if (is_training_choice(key)) continue;
      // head_dim = 0 derives the width from the checkpoint's hidden_size and heads.
      ModelConfig head = theirs.model;
      head.head_dim = cfg.model.head_dim;
      const bool agree = key == "model.head_dim"
                             ? head.head_dim_resolved() == theirs.model.head_dim_resolved()
                             : config_value_toml(cfg, key) == hf_value;
      if (!agree) {
        MOEPEAK_INPUT_ERROR(key, " = ", config_value_toml(cfg, key), " (", origin,
                            ") disagrees with the checkpoint model.init_from starts from: ", source,
                            " has ", key.substr(6), " = ", hf_value,
                            "; remove the key to take the checkpoint's value");
      }
      continue;
    }
    set_config_value(merged, key, hf_value, source);
  }
  check_config(merged);
  return merged;
}

HfCheckpoint::HfCheckpoint(std::string dir) : dir_(std::move(dir)) {
  if (!fs::is_directory(dir_))
    MOEPEAK_INPUT_ERROR("model.init_from: ", dir_, " is not a directory");
  const fs::path root(dir_);
  auto open_file = [&](const std::string& name) {
    files_.push_back(
        std::make_unique<SafetensorsFile>(SafetensorsFile::open((root / name).string())));
    return files_.back().get();
  };
  if (fs::exists(root / kIndexFile)) {
    source_ = (root / kIndexFile).string();
    const nlohmann::json index = read_json_file(source_);
    const nlohmann::json* map =
        index.is_object() && index.contains("weight_map") ? &index.at("weight_map") : nullptr;
    if (!map || !map->is_object()) {
      MOEPEAK_INPUT_ERROR(source_, ": needs a \"weight_map\" object of tensor name -> file");
    }
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos) {
        MOEPEAK_INPUT_ERROR(source_, ": weight_map[\"", tensor, "\"] is ", file.dump(),
                            ", expected a file name in ", dir_);
      }
      const std::string name = file.get<std::string>();
      if (!opened.count(name)) {
        if (!fs::exists(root / name)) {
          MOEPEAK_INPUT_ERROR(source_, ": weight_map[\"", tensor, "\"] names ", name,
                              ", which is not in ", dir_);
        }
        opened[name] = open_file(name);
      }
      if (!opened[name]->contains(tensor)) {
        MOEPEAK_INPUT_ERROR(source_, ": weight_map puts \"", tensor, "\" in ", name,
                            ", but that file has no such tensor");
      }
      file_of_[tensor] = opened[name];
    }
  } else if (fs::exists(root / kSingleFile)) {
    source_ = (root / kSingleFile).string();
    const SafetensorsFile* file = open_file(kSingleFile);
    for (const std::string& tensor : file->names()) file_of_[tensor] = file;
  } else {
    MOEPEAK_INPUT_ERROR("model.init_from: ", dir_, " holds neither ", kSingleFile, " nor ",
                        kIndexFile);
  }
}

std::vector<std::string> HfCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  return names;
}

const SafetensorsFile& HfCheckpoint::file(const std::string& tensor) const {
  auto it = file_of_.find(tensor);
  if (it == file_of_.end()) MOEPEAK_INPUT_ERROR(source_, ": no tensor \"", tensor, "\"");
  return *it->second;
}

void HfCheckpoint::read_elements(const std::string& tensor, int64_t begin, int64_t end,
                                 std::string_view dtype, void* dst) const {
  const SafetensorsFile& f = file(tensor);
  const SafetensorsTensorInfo& info = f.info(tensor);
  if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16") {
    MOEPEAK_INPUT_ERROR(f.path(), ": tensor \"", tensor, "\" is ", info.dtype,
                        "; weights must be F32, BF16 or F16");
  }
  const size_t element = safetensors_element_size(info.dtype);
  const size_t count = static_cast<size_t>(end - begin);
  if (info.dtype == dtype) {
    f.read_bytes(tensor, static_cast<size_t>(begin) * element, dst, count * element);
    return;
  }
  // NOTES: converted through a bounded staging buffer, so a rank's slice of a large tensor is
  // never held twice.
  constexpr size_t kStageElements = size_t{1} << 20;
  std::vector<char> stage(std::min(count, kStageElements) * element);
  const size_t out_element = safetensors_element_size(dtype);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kStageElements);
    f.read_bytes(tensor, (static_cast<size_t>(begin) + done) * element, stage.data(), n * element);
    convert_float_elements(stage.data(), info.dtype, static_cast<char*>(dst) + done * out_element,
                           dtype, n);
    done += n;
  }
}

void load_hf_weights(const HfCheckpoint& hf, ZeroParamStore& params, Stream& stream) {
  const auto& infos = params.layout().params();
  const std::string_view family = enum_name(params.layout().spec().family);
  // Missing first: a config.json that describes other layers than the files hold (a dense layer
  // where the files have experts) names the tensor the family needs.
  for (const ParamInfo& p : infos) {
    if (!hf.contains(p.name)) {
      MOEPEAK_INPUT_ERROR("model.init_from: ", hf.dir(), " has no tensor \"", p.name,
                          "\", a weight of this ", family,
                          " model (as its config.json and the [model] keys describe it)");
    }
  }
  std::set<std::string> expected;
  for (const ParamInfo& p : infos) expected.insert(p.name);
  for (const std::string& name : hf.tensor_names()) {
    if (!expected.count(name)) {
      MOEPEAK_INPUT_ERROR(hf.file(name).path(), ": tensor \"", name,
                          "\" is not a weight of this model (", family,
                          " with the [model] shape); is the checkpoint of another architecture?");
    }
  }
  const std::string_view dtype = safetensors_dtype_name(params.dtype());
  std::vector<char> host;
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    const SafetensorsFile& file = hf.file(p.name);
    const SafetensorsTensorInfo& info = file.info(p.name);
    if (info.shape != p.shape.dims()) {
      MOEPEAK_INPUT_ERROR(file.path(), ": tensor \"", p.name, "\" has shape ",
                          shape_text(info.shape), " but this model's is ", p.shape.str());
    }
    const auto range = params.stored_range(static_cast<int>(i));
    if (!range) continue;
    host.resize(static_cast<size_t>(range->second - range->first) * dtype_size(params.dtype()));
    hf.read_elements(p.name, range->first, range->second, dtype, host.data());
    params.load_stored_range(static_cast<int>(i), host.data(), params.flat_values(), stream);
  }
}

}  // namespace moepeak
