// Starting a run from a Hugging Face Mixtral checkpoint (model.init_from, `train --init-from DIR`).
//
//   DIR/config.json                        MixtralConfig, as transformers 4 or 5 writes it
//   DIR/model.safetensors                  every weight in one file, or
//   DIR/model.safetensors.index.json       {"metadata": {...}, "weight_map": {tensor: file}}
//   DIR/model-00001-of-00004.safetensors   ... and the files the index names
//
//   Config cfg = with_init_from_model(load_config(files, overrides));  // [model] from config.json
//   HfCheckpoint hf(cfg.model.init_from);
//   load_hf_weights(hf, params, stream);                               // this rank's slices
//
// Tensors may be F32, BF16 or F16 (any mix); each is converted to the training dtype as it is
// read (convert_float_elements, core/checkpoint/safetensors.h: widening is exact, narrowing to
// bf16 rounds to nearest even). Each rank reads only the byte ranges of the elements it stores
// (ZeroParamStore::stored_range), so no rank ever holds a whole model. The optimizer starts
// fresh (m = v = 0, the fp32 master taken from the loaded weights), the data from its start.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/model/zero_params.h"

namespace moepeak {

// `cfg` with [model] completed from model.init_from's config.json (unchanged when init_from is
// empty). A [model] key the user did not set takes config.json's value (its origin then names
// the file); a key the user set must agree with it, or the error names both values and where
// each came from. Some keys are training choices rather than properties of the weights and keep
// the user's value when set: router_aux_loss_coef (transformers counts it only with
// output_router_logits), initializer_range (unused when starting from weights), and the context:
// max_position_embeddings and the RoPE scaling (model.rope_type and its model.rope_* parameters,
// not rope_theta), which extending a pretrained model's context changes. The merged
// config is checked like a loaded one (check_config). Idempotent.
Config with_init_from_model(const Config& cfg);

// The weights of a Hugging Face checkpoint directory: which file holds each tensor, its dtype
// and shape (every header parsed at open), and reads of element ranges. Not collective.
class HfCheckpoint {
 public:
  // Throws moepeak::Error naming the path when DIR is not a directory, holds neither
  // model.safetensors nor model.safetensors.index.json, the index is malformed or names a file
  // that is missing, or a file is not valid safetensors.
  explicit HfCheckpoint(std::string dir);

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& tensor) const { return file_of_.count(tensor) != 0; }
  // Every tensor name the checkpoint holds, sorted.
  std::vector<std::string> tensor_names() const;
  // The file holding `tensor` (error naming the checkpoint and the tensor if absent).
  const SafetensorsFile& file(const std::string& tensor) const;
  // Elements [begin, end) of `tensor`'s row-major data, converted to `dtype` (F32 or BF16),
  // into dst ((end - begin) * element size bytes).
  void read_elements(const std::string& tensor, int64_t begin, int64_t end, std::string_view dtype,
                     void* dst) const;

 private:
  std::string dir_;
  std::string source_;  // "DIR/model.safetensors" or "DIR/model.safetensors.index.json"
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;
};

// Sets this rank's stored range of every weight (params.flat_values()) from `hf`. Throws
// moepeak::Error naming the file and tensor when a weight is missing, has another shape, or is
// not a float dtype; a tensor of the checkpoint that is no weight of this model is an error too
// (a checkpoint of another architecture must not load silently). Not collective; synchronises.
void load_hf_weights(const HfCheckpoint& hf, ZeroParamStore& params, Stream& stream);

}  // namespace moepeak
