// HfCheckpoint's FP8 side (hf_import.h): config.json's quantization_config with quant_method
// "fp8" (DeepSeek-V3's, R1's and Kimi-K2's released checkpoints), the X / X_scale_inv pairs seen
// as their X, and their dequantisation by rows (core/checkpoint/fp8.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/checkpoint/fp8.h"
#include "core/checkpoint/hf_import.h"
#include "core/error.h"

namespace moepeak {

namespace {

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + ")";
}

// A float8_e4m3fn NaN: exponent and mantissa all ones (0x7F, 0xFF).
bool is_fp8_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

}  // namespace

void HfCheckpoint::read_fp8_config(const nlohmann::json& q) {
  if (q.contains("fmt") && !q["fmt"].is_null()) {
    const nlohmann::json& fmt = q["fmt"];
    if (!fmt.is_string() || fmt.get<std::string>() != "e4m3") {
      MOEPEAK_INPUT_ERROR(config_path_, ": quantization_config.fmt is ", fmt.dump(),
                          "; moepeak reads FP8 weights as \"e4m3\" (float8_e4m3fn, the format of "
                          "DeepSeek-V3's and Kimi-K2's releases)");
    }
  }
  const nlohmann::json* size = q.contains("weight_block_size") ? &q["weight_block_size"] : nullptr;
  const bool two_ints = size && size->is_array() && size->size() == 2 &&
                        (*size)[0].is_number_integer() && (*size)[1].is_number_integer();
  if (!two_ints || (*size)[0].get<int64_t>() < 1 ||
      (*size)[0].get<int64_t>() != (*size)[1].get<int64_t>()) {
    MOEPEAK_INPUT_ERROR(config_path_, ": quantization_config.weight_block_size must be two equal ",
                        "positive integers [b, b] (the block of rows and columns each FP8 scale "
                        "covers; [128, 128] in DeepSeek-V3's release), got ",
                        size ? size->dump() : std::string("nothing"));
  }
  fp8_block_ = Fp8Block{(*size)[0].get<int64_t>(), (*size)[1].get<int64_t>()};
  fp8_ = true;
}

void HfCheckpoint::pair_fp8_tensors() {
  const std::string suffix(kFp8ScaleSuffix);
  const std::string block = "[" + std::to_string(fp8_block_.rows) + ", " +
                            std::to_string(fp8_block_.cols) + "] (" + config_path_ +
                            "'s weight_block_size)";
  // Scales first: each must scale an FP8 tensor.
  for (const auto& [name, file] : file_of_) {
    if (!name.ends_with(suffix)) continue;
    const std::string x = name.substr(0, name.size() - suffix.size());
    auto it = file_of_.find(x);
    if (it == file_of_.end()) {
      MOEPEAK_INPUT_ERROR(file->path(), ": tensor \"", name, "\" scales no tensor: the checkpoint ",
                          "has no \"", x, "\" (an FP8 weight is the pair X, X", suffix, ")");
    }
    const std::string& dtype = it->second->info(x).dtype;
    if (dtype != kFp8SafetensorsDtype) {
      MOEPEAK_INPUT_ERROR(file->path(), ": tensor \"", name, "\" scales \"", x, "\", which is ",
                          dtype, ", not ", kFp8SafetensorsDtype,
                          " (only FP8 weights have block scales)");
    }
  }
  std::vector<std::string> paired;
  for (const auto& [x, file] : file_of_) {
    const SafetensorsTensorInfo& info = file->info(x);
    if (info.dtype != kFp8SafetensorsDtype) continue;
    const std::string scale_name = x + suffix;
    auto it = file_of_.find(scale_name);
    if (it == file_of_.end()) {
      MOEPEAK_INPUT_ERROR(file->path(), ": tensor \"", x, "\" is ", kFp8SafetensorsDtype,
                          " but the checkpoint has no \"", scale_name,
                          "\": an FP8 weight needs its block scales to be dequantised");
    }
    if (info.shape.size() != 2) {
      MOEPEAK_INPUT_ERROR(file->path(), ": FP8 tensor \"", x, "\" has shape ",
                          dims_text(info.shape), "; block-scaled FP8 weights are 2-D (rows, cols)");
    }
    const SafetensorsFile& scales = *it->second;
    const SafetensorsTensorInfo& s = scales.info(scale_name);
    if (s.dtype != "F32") {
      MOEPEAK_INPUT_ERROR(scales.path(), ": tensor \"", scale_name, "\" is ", s.dtype,
                          "; FP8 block scales must be F32");
    }
    const std::vector<int64_t> grid = {fp8_scale_rows(info.shape[0], fp8_block_),
                                       fp8_scale_cols(info.shape[1], fp8_block_)};
    if (s.shape != grid) {
      MOEPEAK_INPUT_ERROR(scales.path(), ": tensor \"", scale_name, "\" has shape ",
                          dims_text(s.shape), ", but \"", x, "\" ", dims_text(info.shape),
                          " in blocks of ", block, " needs ", dims_text(grid));
    }
    fp8_scales_[x] = &scales;
    paired.push_back(scale_name);
  }
  for (const std::string& name : paired) file_of_.erase(name);
}

void HfCheckpoint::read_fp8(const std::string& tensor, int64_t begin, int64_t end,
                            std::string_view dtype, void* dst) const {
  const SafetensorsFile& codes_file = file(tensor);
  const SafetensorsFile& scales_file = *fp8_scales_.at(tensor);
  const std::string scale_name = tensor + std::string(kFp8ScaleSuffix);
  const std::vector<int64_t>& shape = codes_file.info(tensor).shape;
  const int64_t rows = shape[0], cols = shape[1];
  MOEPEAK_CHECK(0 <= begin && begin <= end && end <= rows * cols, "read_fp8: elements [", begin,
                ", ", end, ") of ", tensor, " ", dims_text(shape));
  MOEPEAK_CHECK(dtype == "F32" || dtype == "BF16", "read_fp8 into ", dtype);
  if (begin == end) return;
  const int64_t b = fp8_block_.rows, scale_cols = fp8_scale_cols(cols, fp8_block_);
  const size_t out_element = safetensors_element_size(dtype);
  // NOTES: whole rows are decoded (those [begin, end) touches, in batches of about 2^20
  // elements that never cross a block row, so one row of scales serves a batch), and the part
  // of them in [begin, end) is kept: a rank's ZeRO shard may start or end inside a row.
  const int64_t batch = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  std::vector<uint8_t> codes;
  std::vector<float> scales(static_cast<size_t>(scale_cols)), decoded;
  int64_t scales_of = -1;  // the block row `scales` holds
  for (int64_t r0 = begin / cols; r0 * cols < end;) {
    const int64_t block_row = r0 / b;
    const int64_t r1 = std::min({rows, (block_row + 1) * b, r0 + batch, (end + cols - 1) / cols});
    if (scales_of != block_row) {
      scales_file.read_bytes(scale_name, static_cast<size_t>(block_row * scale_cols) * 4,
                             scales.data(), scales.size() * 4);
      for (int64_t j = 0; j < scale_cols; ++j) {
        const float s = scales[static_cast<size_t>(j)];
        if (!(std::isfinite(s) && s > 0)) {
          MOEPEAK_INPUT_ERROR(scales_file.path(), ": tensor \"", scale_name, "\": block (",
                              block_row, ", ", j, ") has scale ", s,
                              "; FP8 block scales must be finite and positive");
        }
      }
      scales_of = block_row;
    }
    const int64_t n = (r1 - r0) * cols;
    codes.resize(static_cast<size_t>(n));
    codes_file.read_bytes(tensor, static_cast<size_t>(r0 * cols), codes.data(), codes.size());
    for (int64_t k = 0; k < n; ++k) {
      const uint8_t c = codes[static_cast<size_t>(k)];
      if (is_fp8_nan(c)) {
        MOEPEAK_INPUT_ERROR(codes_file.path(), ": tensor \"", tensor, "\": element (",
                            r0 + k / cols, ", ", k % cols, ") is ", c == 0x7F ? "0x7F" : "0xFF",
                            ", float8_e4m3fn's NaN");
      }
    }
    decoded.resize(static_cast<size_t>(n));
    // Rows r0..r1-1 lie in one block row: its scales are the whole grid of this batch.
    fp8_block_dequantize(tensor, codes, r1 - r0, cols, scales, fp8_block_, decoded);
    const int64_t lo = std::max(begin, r0 * cols), hi = std::min(end, r1 * cols);
    convert_float_elements(decoded.data() + (lo - r0 * cols), "F32",
                           static_cast<char*>(dst) + static_cast<size_t>(lo - begin) * out_element,
                           dtype, static_cast<size_t>(hi - lo));
    r0 = r1;
  }
}

}  // namespace moepeak
