// Hugging Face checkpoints as a starting point: config merge, the checkpoint's files and sliced
// weight reads through the family's Hub layout (contract in hf_import.h; the MXFP4 side of
// HfCheckpoint is in hf_import_mxfp4.cpp, the FP8 side in hf_import_fp8.cpp).
#include "core/checkpoint/hf_import.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>

#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/mtp_layers.h"
#include "core/error.h"
#include "core/model/hub_layout.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Keys of [model] that are training choices, not properties of the weights (hf_import.h).
// Keys a run may set apart from the checkpoint's config.json: the loss, the balancing rate and
// the initialisation, and the context — extending a pretrained model's context is setting RoPE
// scaling (model.rope_*) and the new max_position_embeddings over the weights it was trained with
// (docs/models.md#extending-the-context). rope_theta and rope_interleave (the pairs' layout in
// the weights) are properties of the weights.
bool is_training_choice(const std::string& key) {
  return key == "model.router_aux_loss_coef" || key == "model.eos_token_id" ||
         key == "model.router_bias_update_rate" || key == "model.initializer_range" ||
         key == "model.max_position_embeddings" || key == "model.rope_type" ||
         (key.rfind("model.rope_", 0) == 0 && key != "model.rope_theta" &&
          key != "model.rope_interleave");
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
  stored_ = file_of_;  // before the quantised pairs are seen as their X
  read_quantization();
}

std::vector<std::string> HfCheckpoint::stored_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : stored_) names.push_back(name);
  return names;  // a std::map's order: sorted
}

const SafetensorsFile& HfCheckpoint::stored_file(const std::string& stored) const {
  auto it = stored_.find(stored);
  if (it == stored_.end()) MOEPEAK_INPUT_ERROR(source_, ": no tensor \"", stored, "\"");
  return *it->second;
}

std::vector<std::string> HfCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  for (const auto& [name, pair] : mxfp4_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<int64_t> HfCheckpoint::shape(const std::string& tensor) const {
  if (auto it = mxfp4_.find(tensor); it != mxfp4_.end()) {
    std::vector<int64_t> s = it->second.decoded;
    std::swap(s[s.size() - 1], s[s.size() - 2]);
    return s;
  }
  return file(tensor).info(tensor).shape;
}

const std::string& HfCheckpoint::path(const std::string& tensor) const {
  if (auto it = mxfp4_.find(tensor); it != mxfp4_.end()) return it->second.blocks->path();
  return file(tensor).path();
}

const SafetensorsFile& HfCheckpoint::file(const std::string& tensor) const {
  auto it = file_of_.find(tensor);
  if (it == file_of_.end()) {
    MOEPEAK_INPUT_ERROR(source_, ": no tensor \"", tensor, "\"",
                        mxfp4_.count(tensor) ? " (it is MXFP4: _blocks and _scales)" : "");
  }
  return *it->second;
}

void HfCheckpoint::read_elements(const std::string& tensor, int64_t begin, int64_t end,
                                 std::string_view dtype, void* dst) const {
  if (is_fp8(tensor)) {
    read_fp8(tensor, begin, end, dtype, dst);
    return;
  }
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

namespace {

// Reads elements [begin, end) of the Hub tensor's storage (the tensor itself, or its MXFP4
// decode) in the training dtype; begin and end are multiples of the source's granularity.
struct HubSource {
  std::function<void(int64_t begin, int64_t end, void* dst)> read;
  int64_t granularity = 1;  // 1, or the decode's row length for MXFP4
  int64_t size = 0;         // elements of the storage
};

// Elements [begin, end) of a param placed by `placement` (in the source's space) into dst, in
// the training dtype of `element` bytes. NOTES: the walk visits the param's elements in
// increasing source order (hub_layout.h), so the source is read front to back through one
// window of about kWindowElements, refilled where the walk first needs an element past it and
// never past the param's last element (rounded up to the source's granularity): the reads stay
// within the span of the Hub tensor the param lies in (an expert's slab), and only the windows
// holding elements of [begin, end) are read.
void read_placed(const HubSource& source, const HubPlacement& placement,
                 const std::vector<int64_t>& dims, int64_t begin, int64_t end, size_t element,
                 char* dst) {
  constexpr int64_t kWindowElements = int64_t{1} << 20;
  const int64_t g = source.granularity;
  const int64_t window = std::max(g, kWindowElements / g * g);
  int64_t last = placement.offset;
  for (size_t k = 0; k < dims.size(); ++k) last += (dims[k] - 1) * placement.strides[k];
  const int64_t limit = std::min(source.size, (last / g + 1) * g);
  std::vector<char> buffer(static_cast<size_t>(std::min(window, limit)) * element);
  int64_t w0 = 0, w1 = 0;  // the window's elements of the source
  for_each_in_hub_order(placement, dims, [&](int64_t param, int64_t hub) {
    if (param < begin || param >= end) return;
    if (hub >= w1) {
      w0 = hub - hub % g;
      w1 = std::min(limit, w0 + window);
      source.read(w0, w1, buffer.data());
    }
    std::memcpy(dst + static_cast<size_t>(param - begin) * element,
                buffer.data() + static_cast<size_t>(hub - w0) * element, element);
  });
}

}  // namespace

void load_hf_weights(const HfCheckpoint& hf, ZeroParamStore& params, Stream& stream,
                     int64_t mtp_layers) {
  const ParamLayout& layout = params.layout();
  const int64_t layers = static_cast<int64_t>(layout.spec().layers.size());
  const auto& infos = layout.params();
  const HubLayout hub(layout);
  const std::string_view family = enum_name(layout.spec().family);
  if (hf.quantized() && !hub.has_mxfp4()) {
    MOEPEAK_INPUT_ERROR(hf.config_path(), ": quantization_config (quant_method \"mxfp4\") on a ",
                        family, " checkpoint; moepeak dequantises MXFP4 only where a family's ",
                        "released checkpoints hold it (gpt_oss's experts)");
  }
  // Missing first: a config.json that describes other layers than the files hold (a dense layer
  // where the files have experts) names the tensor the family needs.
  for (const HubTensor& t : hub.tensors()) {
    if (!hf.contains(t.name) && hf.contains(t.name + "_blocks")) {
      MOEPEAK_INPUT_ERROR(hf.path(t.name + "_blocks"), ": tensor \"", t.name,
                          "\" is there as MXFP4 (_blocks and _scales), which needs ",
                          hf.config_path(), "'s quantization_config with quant_method \"mxfp4\"");
    }
    if (!hf.contains(t.name)) {
      MOEPEAK_INPUT_ERROR("model.init_from: ", hf.dir(), " has no tensor \"", t.name,
                          "\", a weight of this ", family,
                          " model (as its config.json and the [model] keys describe it)",
                          t.mxfp4 ? " nor its MXFP4 pair _blocks and _scales" : "");
    }
    // FP8 codes without quant_method "fp8" have no block size to be dequantised with: named
    // here with config.json, rather than by the read as a dtype it cannot convert.
    if (!hf.is_fp8(t.name) && !hf.is_mxfp4(t.name) &&
        hf.file(t.name).info(t.name).dtype == kFp8SafetensorsDtype) {
      MOEPEAK_INPUT_ERROR(hf.path(t.name), ": tensor \"", t.name, "\" is ", kFp8SafetensorsDtype,
                          ", but ", hf.config_path(),
                          hf.quant_method().empty() ? std::string(" has no quantization_config")
                                                    : " has quantization_config.quant_method \"" +
                                                          hf.quant_method() + "\"",
                          "; FP8 weights need quant_method \"fp8\" with their weight_block_size "
                          "to be dequantised");
    }
  }
  for (const std::string& name : hf.tensor_names()) {
    if (hub.find(name) < 0 && mtp_layer_of(name, layers, mtp_layers) < 0) {
      const bool packed = name.ends_with("_blocks") || name.ends_with("_scales");
      const bool scales = name.ends_with(kFp8ScaleSuffix);
      MOEPEAK_INPUT_ERROR(hf.path(name), ": tensor \"", name, "\" is not a weight of this model (",
                          family, " with the [model] shape", mtp_layers > 0 ? " and its " : "",
                          mtp_layers > 0 ? std::to_string(mtp_layers) + " MTP layer(s)" : "",
                          "); is the checkpoint of another architecture?",
                          packed && !hf.quantized()
                              ? " (MXFP4 _blocks and _scales need config.json's "
                                "quantization_config with quant_method \"mxfp4\")"
                              : "",
                          scales && !hf.fp8() ? " (FP8 block scales _scale_inv need config.json's "
                                                "quantization_config with quant_method \"fp8\")"
                                              : "");
    }
  }
  // Each Hub tensor's shape, once (an MXFP4 one as decoded).
  for (const HubTensor& t : hub.tensors()) {
    const bool mxfp4 = hf.is_mxfp4(t.name);
    if (mxfp4 && !t.mxfp4) {
      MOEPEAK_INPUT_ERROR(hf.path(t.name), ": tensor \"", t.name,
                          "\" is MXFP4 (_blocks and _scales), but moepeak dequantises only the "
                          "tensors the released checkpoints hold so (gpt_oss's experts' "
                          "gate_up_proj and down_proj), not a ",
                          family, " model's \"", t.name, "\"");
    }
    const std::vector<int64_t> shape = hf.shape(t.name);
    if (shape != t.shape) {
      MOEPEAK_INPUT_ERROR(hf.path(t.name), ": tensor \"", t.name, "\" has shape ",
                          shape_text(shape),
                          mxfp4 ? " (its MXFP4 decode with the last two dims swapped)" : "",
                          " but this model's is ", shape_text(t.shape));
    }
  }
  const std::string dtype(safetensors_dtype_name(params.dtype()));
  const size_t element = dtype_size(params.dtype());
  std::vector<char> host;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto range = params.stored_range(static_cast<int>(i));
    if (!range) continue;  // another rank's expert
    const HubTensor& t = hub.tensors()[static_cast<size_t>(hub.tensor_of(static_cast<int>(i)))];
    const std::vector<int64_t>& dims = infos[i].shape.dims();
    host.resize(static_cast<size_t>(range->second - range->first) * element);
    if (range->first == range->second) {
      // All padding here: nothing to read.
    } else if (hf.is_mxfp4(t.name)) {
      const HubSource decoded{
          [&](int64_t b, int64_t e, void* dst) { hf.read_decoded(t.name, b, e, dtype, dst); },
          hf.decoded_row(t.name), t.numel()};
      read_placed(decoded, mxfp4_decoded_placement(hub.placement(static_cast<int>(i)), dims), dims,
                  range->first, range->second, element, host.data());
    } else if (hub.is_whole(t)) {
      hf.read_elements(t.name, range->first, range->second, dtype, host.data());
    } else {
      const HubSource plain{
          [&](int64_t b, int64_t e, void* dst) { hf.read_elements(t.name, b, e, dtype, dst); }, 1,
          t.numel()};
      read_placed(plain, hub.placement(static_cast<int>(i)), dims, range->first, range->second,
                  element, host.data());
    }
    params.load_stored_range(static_cast<int>(i), host.data(), params.flat_values(), stream);
  }
}

}  // namespace moepeak
