// Starting a run from a Hugging Face checkpoint of a supported family (model.init_from,
// `train --init-from DIR`).
//
//   DIR/config.json                        the family's config, as transformers 4 or 5 writes it
//   DIR/model.safetensors                  every weight in one file, or
//   DIR/model.safetensors.index.json       {"metadata": {...}, "weight_map": {tensor: file}}
//   DIR/model-00001-of-00004.safetensors   ... and the files the index names
//
//   Config cfg = with_init_from_model(load_config(files, overrides));  // [model] from config.json
//   HfCheckpoint hf(cfg.model.init_from);
//   load_hf_weights(hf, params, stream);                               // this rank's slices
//
// The files hold the Hub's tensors (HubLayout, core/model/hub_layout.h): one per param for
// mixtral and qwen3_moe; gpt-oss's experts fused per layer, each expert's gate, up and down a
// strided part of mlp.experts.gate_up_proj / down_proj. Tensors may be F32, BF16 or F16 (any mix);
// each is converted to the training dtype as it is read (convert_float_elements,
// core/checkpoint/safetensors.h: widening is exact, narrowing to bf16 rounds to nearest even).
//
// MXFP4 (gpt-oss's released checkpoints): with config.json's quantization_config quant_method
// "mxfp4", a tensor X held as X_blocks (U8 [..., rows, cols/32, 16]) and X_scales (U8 [..., rows,
// cols/32]) is read by decoding them (core/checkpoint/mxfp4.h, exact in f32 and bf16): the
// decoded [..., rows, cols] with its last two dims swapped is X, as transformers'
// convert_moe_packed_tensors gives it. Only the Hub tensors the family marks MXFP4 may be so
// (gpt-oss's gate_up_proj and down_proj); quantization_config.modules_to_not_convert is honoured
// (a listed module held as MXFP4 is an error), with transformers' matching of its patterns.
//
// FP8 (DeepSeek-V3's, R1's and Kimi-K2's released checkpoints; Qwen3's -FP8 ones): with
// config.json's quantization_config {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
// [b, b], ...}, a tensor X held as F8_E4M3 (rows, cols) with X_scale_inv (F32 (ceil(rows/b),
// ceil(cols/b))) is read as its dequantisation (core/checkpoint/fp8.h): W[i, j] =
// e4m3fn(X[i, j]) * X_scale_inv[i/b, j/b], an fp32 product (the edge blocks may be partial), then
// converted to the training dtype (exact in f32, round to nearest even in bf16). Any 2-D Hub
// tensor may be so (the releases quantise the attention and MLP projections; embeddings, norms,
// the router and lm_head stay BF16). Which tensors are FP8 is the files' dtype; fmt absent means
// e4m3; activation_scheme and modules_to_not_convert do not concern the weights and are not read.
// Code: hf_import_fp8.cpp.
//
// Multi-token prediction (MTP) layers (DeepSeek-V3's released checkpoints hold
// num_nextn_predict_layers of them): the tensors model.layers.{L}.* for num_hidden_layers <= L <
// num_hidden_layers + num_nextn_predict_layers are no weight of the model moepeak trains; the
// import leaves them to core/checkpoint/mtp_layers.h, which carries them, as stored, to the run's
// checkpoints and its export.
//
// Each rank reads only what it stores (ZeroParamStore::stored_range): a param that is a Hub
// tensor of its own, the byte range of its elements; a strided part of a fused tensor, the
// contiguous span of the Hub tensor that covers it (an expert's slab [e], gate and up together)
// through a bounded window, or for MXFP4 the blocks and scales of that span, decoded. So no rank
// ever holds a whole model, and a rank decodes only its own experts. The optimizer starts fresh
// (m = v = 0, the fp32 master taken from the loaded weights), the data from its start.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (quantization_config)

#include "core/checkpoint/fp8.h"
#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/model/zero_params.h"

namespace moepeak {

// `cfg` with [model] completed from model.init_from's config.json (unchanged when init_from is
// empty). A [model] key the user did not set takes config.json's value (its origin then names
// the file); a key the user set must agree with it, or the error names both values and where
// each came from. Some keys are training choices rather than properties of the weights and keep
// the user's value when set: router_aux_loss_coef (transformers counts it only with
// output_router_logits), router_bias_update_rate (the balancing's rate), initializer_range
// (unused when starting from weights), and the context: max_position_embeddings and the RoPE
// scaling (model.rope_type and its model.rope_* parameters, not rope_theta nor rope_interleave),
// which extending a pretrained model's context changes. The merged
// config is checked like a loaded one (check_config). Idempotent.
Config with_init_from_model(const Config& cfg);

// The safetensors dtype of FP8 weights and the suffix of their block scales' tensor.
inline constexpr std::string_view kFp8SafetensorsDtype = "F8_E4M3";
inline constexpr std::string_view kFp8ScaleSuffix = "_scale_inv";

// The weights of a Hugging Face checkpoint directory: which file holds each tensor, its dtype
// and shape (every header parsed at open), config.json's quantization, and reads of element
// ranges. A tensor held as MXFP4 (X_blocks + X_scales) appears as X, an FP8 one (X +
// X_scale_inv) too. Not collective.
class HfCheckpoint {
 public:
  // Throws moepeak::Error naming the path when DIR is not a directory, holds neither
  // model.safetensors nor model.safetensors.index.json, the index is malformed or names a file
  // that is missing, or a file is not valid safetensors; and naming DIR/config.json and the
  // field when its quantization_config is not an object, has a quant_method other than "mxfp4"
  // and "fp8", a malformed modules_to_not_convert (mxfp4), an fmt other than "e4m3" or a
  // weight_block_size that is not two equal positive integers (fp8). With quant_method "mxfp4",
  // naming the file and the tensor when X_blocks has no X_scales or the reverse, either is not
  // U8, their shapes do not pair (mxfp4_decoded_shape), X is there too, or X's module is in
  // modules_to_not_convert. With quant_method "fp8", naming the file and the tensor when an
  // F8_E4M3 X has no X_scale_inv, an X_scale_inv has no F8_E4M3 X, X is not 2-D, X_scale_inv is
  // not F32 or its shape is not X's block grid.
  explicit HfCheckpoint(std::string dir);

  const std::string& dir() const { return dir_; }
  // config.json has quantization_config with quant_method "mxfp4".
  bool quantized() const { return quantized_; }
  // config.json has quantization_config with quant_method "fp8"; its weight_block_size.
  bool fp8() const { return fp8_; }
  Fp8Block fp8_block() const { return fp8_block_; }
  // config.json's quant_method ("" without a quantization_config).
  const std::string& quant_method() const { return quant_method_; }
  const std::string& config_path() const { return config_path_; }
  // A tensor of the checkpoint: plain, MXFP4 or FP8.
  bool contains(const std::string& tensor) const {
    return file_of_.count(tensor) != 0 || mxfp4_.count(tensor) != 0;
  }
  bool is_mxfp4(const std::string& tensor) const { return mxfp4_.count(tensor) != 0; }
  // An F8_E4M3 tensor with its X_scale_inv (quant_method "fp8").
  bool is_fp8(const std::string& tensor) const { return fp8_scales_.count(tensor) != 0; }
  // Every tensor name the checkpoint holds, sorted; an MXFP4 pair as its X, an FP8 pair too.
  std::vector<std::string> tensor_names() const;
  // Every tensor as the files hold it (X_blocks, X_scales, X_scale_inv included), sorted, and the
  // file holding one of them (an error naming the checkpoint if it has no such tensor): what is
  // copied byte for byte (core/checkpoint/mtp_layers.h).
  std::vector<std::string> stored_names() const;
  const SafetensorsFile& stored_file(const std::string& stored) const;
  // The shape of X: its file's (an FP8 X's codes), or for MXFP4 the decoded shape with its last
  // two dims swapped.
  std::vector<int64_t> shape(const std::string& tensor) const;
  // The file holding a tensor (for an MXFP4 X, its X_blocks' file), for messages.
  const std::string& path(const std::string& tensor) const;
  // The file holding a plain tensor, or an FP8 one's codes (error naming the checkpoint and the
  // tensor if absent or MXFP4).
  const SafetensorsFile& file(const std::string& tensor) const;
  // Elements [begin, end) of a plain `tensor`'s row-major data, converted to `dtype` (F32 or
  // BF16), into dst ((end - begin) * element size bytes). An FP8 tensor's are its dequantisation
  // (see above), read by whole rows from the block row(s) they lie in: throws naming the file,
  // the tensor and the element for a NaN code (0x7F, 0xFF), and X_scale_inv and the block for a
  // scale that is NaN, infinite, zero or negative. A tensor of another dtype (F8_E4M3 without
  // quant_method "fp8" included) is an error naming its file.
  void read_elements(const std::string& tensor, int64_t begin, int64_t end, std::string_view dtype,
                     void* dst) const;
  // MXFP4 X: the length of a row of its decode ([..., rows, cols]: cols).
  int64_t decoded_row(const std::string& tensor) const;
  // MXFP4 X: elements [begin, end) of its row-major decode [..., rows, cols] (begin and end
  // multiples of cols), decoded exactly and stored as `dtype` (F32 or BF16). Throws naming the
  // file, the tensor and the row for a scale of 255 (NaN) or an element that overflows f32.
  void read_decoded(const std::string& tensor, int64_t begin, int64_t end, std::string_view dtype,
                    void* dst) const;

 private:
  struct Mxfp4Pair {
    const SafetensorsFile* blocks;
    const SafetensorsFile* scales;
    std::vector<int64_t> decoded;  // [..., rows, cols]
  };
  void read_quantization();
  void pair_mxfp4_tensors(const std::vector<std::string>& not_converted);
  void read_fp8_config(const nlohmann::json& quantization);  // hf_import_fp8.cpp
  void pair_fp8_tensors();
  void read_fp8(const std::string& tensor, int64_t begin, int64_t end, std::string_view dtype,
                void* dst) const;
  std::string dir_;
  std::string source_;  // "DIR/model.safetensors" or "DIR/model.safetensors.index.json"
  std::string config_path_;
  std::string quant_method_;
  bool quantized_ = false;
  bool fp8_ = false;
  Fp8Block fp8_block_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> stored_;   // every tensor as stored
  std::map<std::string, const SafetensorsFile*> file_of_;  // plain tensors, FP8 codes too
  std::map<std::string, Mxfp4Pair> mxfp4_;
  std::map<std::string, const SafetensorsFile*> fp8_scales_;  // FP8 X -> X_scale_inv's file
};

// Sets this rank's stored range of every weight (params.flat_values()) from `hf`, through the
// family's Hub layout. Throws moepeak::Error naming the file and the Hub tensor when one is
// missing, has another shape (checked once per Hub tensor; both shapes named), or is not a float
// dtype (an F8_E4M3 one without config.json's quant_method "fp8" naming config.json too); a
// tensor of the checkpoint that is no Hub tensor of this model is an error too (a checkpoint of
// another architecture must not load silently), but for those of the `mtp_layers` MTP layers
// (model.layers.{L}.* for L from the model's layer count on: the model's num_nextn_predict_layers;
// core/checkpoint/mtp_layers.h carries them), as are MXFP4 where the family has none (naming
// config.json and the family) and an MXFP4 tensor the family does not mark so. Not collective;
// synchronises.
void load_hf_weights(const HfCheckpoint& hf, ZeroParamStore& params, Stream& stream,
                     int64_t mtp_layers = 0);

}  // namespace moepeak
