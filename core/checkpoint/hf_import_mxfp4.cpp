// HfCheckpoint's MXFP4 side (hf_import.h): config.json's quantization_config (handing "fp8" to
// hf_import_fp8.cpp), the X_blocks / X_scales pairs seen as their X, and their decode by rows
// (core/checkpoint/mxfp4.h).
#include <algorithm>
#include <filesystem>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/mxfp4.h"
#include "core/error.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kBlocksSuffix = "_blocks";
constexpr std::string_view kScalesSuffix = "_scales";

// "(0, 5)": row `row` of the decode's leading dims [..., rows].
std::string row_text(const std::vector<int64_t>& decoded, int64_t row) {
  std::vector<int64_t> index(decoded.size() - 1);
  for (size_t d = index.size(); d-- > 0;) {
    index[d] = row % decoded[d];
    row /= decoded[d];
  }
  std::string s = "(";
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + ")";
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + ")";
}

// The Shape of a safetensors tensor's dims (at most Shape::kMaxDims).
Shape shape_of(const std::vector<int64_t>& d, const std::string& path, const std::string& name) {
  switch (d.size()) {
    case 1:
      return Shape{d[0]};
    case 2:
      return Shape{d[0], d[1]};
    case 3:
      return Shape{d[0], d[1], d[2]};
    case 4:
      return Shape{d[0], d[1], d[2], d[3]};
    case 5:
      return Shape{d[0], d[1], d[2], d[3], d[4]};
    case 6:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5]};
    default:
      MOEPEAK_INPUT_ERROR(path, ": MXFP4 tensor \"", name, "\" has shape ", dims_text(d),
                          "; blocks and scales have 1 to ", Shape::kMaxDims, " dims");
  }
}

// transformers' should_convert_module (quantizers_utils.py), negated: `module` is listed when a
// pattern matches it as a regex from its start up to a module boundary (the match ends at a "."
// of the name, just after one, or at its end: "layer.1" lists "layer.1.attn" but not
// "layer.11.attn"; "model.layers.*.self_attn" lists every layer's self_attn), or is a suffix of
// it. `config` names the file for an invalid pattern.
bool listed_module(const std::string& module, const std::vector<std::string>& patterns,
                   const std::string& config) {
  for (const std::string& key : patterns) {
    if (module.ends_with(key)) return true;
    std::regex re;
    try {
      re = std::regex(key, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      MOEPEAK_INPUT_ERROR(config, ": quantization_config.modules_to_not_convert holds \"", key,
                          "\", which is not a regular expression (", e.what(), ")");
    }
    // NOTES: Python's re.match tries every length of the match; here every prefix that ends at
    // a boundary is tried whole.
    for (size_t end = 0; end <= module.size(); ++end) {
      const bool boundary =
          end == module.size() || module[end] == '.' || (end > 0 && module[end - 1] == '.');
      if (boundary && std::regex_match(module.begin(), module.begin() + end, re)) return true;
    }
  }
  return false;
}

}  // namespace

void HfCheckpoint::read_quantization() {
  config_path_ = (fs::path(dir_) / "config.json").string();
  if (!fs::exists(config_path_)) return;
  const nlohmann::json config = read_json_file(config_path_);
  if (!config.is_object() || !config.contains("quantization_config") ||
      config.at("quantization_config").is_null()) {
    return;
  }
  const nlohmann::json& q = config.at("quantization_config");
  const nlohmann::json* method =
      q.is_object() && q.contains("quant_method") ? &q["quant_method"] : nullptr;
  if (!method || !method->is_string()) {
    MOEPEAK_INPUT_ERROR(config_path_, ": quantization_config must be an object with a string ",
                        "\"quant_method\", got ", q.dump());
  }
  quant_method_ = method->get<std::string>();
  if (quant_method_ == "fp8") {
    read_fp8_config(q);
    pair_fp8_tensors();
    return;
  }
  if (quant_method_ != "mxfp4") {
    MOEPEAK_INPUT_ERROR(config_path_, ": quantization_config.quant_method is \"", quant_method_,
                        "\"; moepeak reads only \"mxfp4\" (gpt-oss's released experts) and "
                        "\"fp8\" (DeepSeek-V3's and Kimi-K2's block-scaled release), both "
                        "dequantised on import, besides unquantised checkpoints");
  }
  std::vector<std::string> not_converted;
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null()) {
    const nlohmann::json& list = q["modules_to_not_convert"];
    const bool strings =
        list.is_array() && std::all_of(list.begin(), list.end(),
                                       [](const nlohmann::json& m) { return m.is_string(); });
    if (!strings) {
      MOEPEAK_INPUT_ERROR(config_path_, ": quantization_config.modules_to_not_convert must be a ",
                          "list of module names, got ", list.dump());
    }
    for (const nlohmann::json& m : list) not_converted.push_back(m.get<std::string>());
  }
  quantized_ = true;
  pair_mxfp4_tensors(not_converted);
}

void HfCheckpoint::pair_mxfp4_tensors(const std::vector<std::string>& not_converted) {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  for (const std::string& name : names) {
    if (!file_of_.count(name)) continue;  // a pair's scales, paired from its blocks
    const bool blocks = name.ends_with(kBlocksSuffix);
    if (!blocks && !name.ends_with(kScalesSuffix)) continue;
    const std::string x = name.substr(0, name.size() - kBlocksSuffix.size());
    const std::string blocks_name = x + std::string(kBlocksSuffix);
    const std::string scales_name = x + std::string(kScalesSuffix);
    const SafetensorsFile& here = *file_of_.at(name);
    if (!blocks && file_of_.count(blocks_name)) continue;  // paired from its blocks below
    if (!blocks || !file_of_.count(scales_name)) {
      MOEPEAK_INPUT_ERROR(here.path(), ": tensor \"", name, "\" has no \"",
                          blocks ? scales_name : blocks_name,
                          "\" in the checkpoint; an MXFP4 tensor is the pair X_blocks, X_scales");
    }
    const SafetensorsFile& scales = *file_of_.at(scales_name);
    if (file_of_.count(x)) {
      MOEPEAK_INPUT_ERROR(here.path(), ": the checkpoint holds both \"", x,
                          "\" and its MXFP4 pair ", "\"", blocks_name, "\", \"", scales_name,
                          "\"; which one is meant?");
    }
    for (const auto& [file, tensor] : {std::pair{&here, &blocks_name}, {&scales, &scales_name}}) {
      const std::string& dtype = file->info(*tensor).dtype;
      if (dtype != "U8") {
        MOEPEAK_INPUT_ERROR(file->path(), ": MXFP4 tensor \"", *tensor, "\" is ", dtype,
                            "; its bytes must be U8");
      }
    }
    const std::vector<int64_t>& blocks_shape = here.info(blocks_name).shape;
    const std::vector<int64_t>& scales_shape = scales.info(scales_name).shape;
    Shape decoded;
    try {
      decoded = mxfp4_decoded_shape(x, shape_of(blocks_shape, here.path(), blocks_name),
                                    shape_of(scales_shape, scales.path(), scales_name));
    } catch (const Error& e) {
      MOEPEAK_INPUT_ERROR(here.path(), ": ", nested_message(e));
    }
    if (decoded.ndim() < 2) {
      MOEPEAK_INPUT_ERROR(here.path(), ": MXFP4 tensor \"", x, "\" decodes to ", decoded.str(),
                          ", which has no two last dims to swap ([..., rows, cols])");
    }
    const std::string module = x.substr(0, std::min(x.size(), x.rfind('.')));
    if (listed_module(module, not_converted, config_path_)) {
      MOEPEAK_INPUT_ERROR(here.path(), ": tensor \"", x, "\" is MXFP4 (\"", blocks_name, "\", \"",
                          scales_name, "\"), but ", config_path_,
                          "'s quantization_config.modules_to_not_convert lists its module \"",
                          module, "\"");
    }
    mxfp4_[x] = Mxfp4Pair{&here, &scales, decoded.dims()};
    file_of_.erase(blocks_name);
    file_of_.erase(scales_name);
  }
}

int64_t HfCheckpoint::decoded_row(const std::string& tensor) const {
  auto it = mxfp4_.find(tensor);
  if (it == mxfp4_.end()) MOEPEAK_INPUT_ERROR(source_, ": no MXFP4 tensor \"", tensor, "\"");
  return it->second.decoded.back();
}

void HfCheckpoint::read_decoded(const std::string& tensor, int64_t begin, int64_t end,
                                std::string_view dtype, void* dst) const {
  auto it = mxfp4_.find(tensor);
  if (it == mxfp4_.end()) MOEPEAK_INPUT_ERROR(source_, ": no MXFP4 tensor \"", tensor, "\"");
  const Mxfp4Pair& pair = it->second;
  const int64_t cols = pair.decoded.back(), groups = cols / kMxfp4BlockSize;
  MOEPEAK_CHECK(begin % cols == 0 && end % cols == 0 && begin <= end, "read_decoded: elements [",
                begin, ", ", end, ") are not whole rows of ", cols);
  MOEPEAK_CHECK(dtype == "F32" || dtype == "BF16", "read_decoded into ", dtype);
  const std::string blocks_name = tensor + std::string(kBlocksSuffix);
  const std::string scales_name = tensor + std::string(kScalesSuffix);
  const size_t out_element = safetensors_element_size(dtype);
  // NOTES: a bounded batch of rows at a time (about 2^20 elements), decoded row by row so that an
  // error names its row.
  const int64_t batch = std::max<int64_t>(1, (int64_t{1} << 20) / cols);
  std::vector<uint8_t> blocks, scales;
  std::vector<float> decoded;
  for (int64_t r0 = begin / cols; r0 < end / cols; r0 += batch) {
    const int64_t r1 = std::min(end / cols, r0 + batch);
    blocks.resize(static_cast<size_t>((r1 - r0) * groups * kMxfp4BytesPerBlock));
    scales.resize(static_cast<size_t>((r1 - r0) * groups));
    pair.blocks->read_bytes(blocks_name, static_cast<size_t>(r0 * groups * kMxfp4BytesPerBlock),
                            blocks.data(), blocks.size());
    pair.scales->read_bytes(scales_name, static_cast<size_t>(r0 * groups), scales.data(),
                            scales.size());
    decoded.resize(static_cast<size_t>((r1 - r0) * cols));
    for (int64_t r = r0; r < r1; ++r) {
      const size_t local = static_cast<size_t>(r - r0);
      try {
        mxfp4_dequantize(tensor,
                         std::span<const uint8_t>(blocks).subspan(
                             local * static_cast<size_t>(groups * kMxfp4BytesPerBlock),
                             static_cast<size_t>(groups * kMxfp4BytesPerBlock)),
                         Shape{groups, kMxfp4BytesPerBlock},
                         std::span<const uint8_t>(scales).subspan(
                             local * static_cast<size_t>(groups), static_cast<size_t>(groups)),
                         Shape{groups},
                         std::span<float>(decoded).subspan(local * static_cast<size_t>(cols),
                                                           static_cast<size_t>(cols)));
      } catch (const Error& e) {
        MOEPEAK_INPUT_ERROR(pair.blocks->path(), ": row ", row_text(pair.decoded, r), " of ",
                            dims_text(pair.decoded), ": ", nested_message(e));
      }
    }
    char* out = static_cast<char*>(dst) + static_cast<size_t>(r0 * cols - begin) * out_element;
    convert_float_elements(decoded.data(), "F32", out, dtype, decoded.size());
  }
}

}  // namespace moepeak
