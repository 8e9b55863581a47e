// Exporting a training checkpoint as a Hugging Face model (`moepeak export`).
//
//   OUT/config.json                        the family's config.json (model_config_json),
//   torch_dtype and
//                                          dtype = the exported dtype
//   OUT/generation_config.json             {"_from_model_config": true}
//   OUT/model.safetensors.index.json       {"metadata": {"total_size": bytes of the weights},
//                                           "weight_map": {tensor: file}}
//   OUT/model-00001-of-0000n.safetensors   the weights, greedily packed in model order into
//                                          files of at most max_shard_bytes (a tensor larger
//                                          than that gets a file of its own), as transformers'
//                                          save_pretrained does; metadata {"format": "pt"}
//
// transformers' MixtralForCausalLM.from_pretrained(OUT) loads it; so does `train --init-from OUT`
// (core/checkpoint/hf_import.h). Only the weights are exported (no optimizer state).
//
// Streaming: each tensor goes from the checkpoint's shard files (memory-mapped, every block
// verified: a corrupt checkpoint is an error, never a corrupt export) through one staging buffer
// of `buffer_bytes`, converted on the way, into its output file; host memory beyond the page cache
// is that buffer, whatever the model's size. OUT appears whole or not at all: the files are
// written into a sibling ".tmp_export_*" directory that is renamed to OUT last.
#pragma once

#include <cstdint>
#include <string>

namespace moepeak {

struct HfExportOptions {
  std::string dtype = "BF16";                // safetensors spelling: "BF16" or "F32"
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  uint64_t buffer_bytes = 64ull << 20;       // the staging buffer (at least 4 KiB)
};

struct HfExportSummary {
  std::string checkpoint;  // the step directory exported
  int files = 0;           // model-*-of-* files written
  int64_t tensors = 0;
  uint64_t total_bytes = 0;  // metadata.total_size
};

// Exports `checkpoint` (a step directory with manifest.json, or a checkpoint folder whose `latest`
// names one) to `out`, which must not exist (or be an empty directory). Not collective: one
// process reads every shard file. Throws moepeak::Error naming the file and tensor when the
// checkpoint is incomplete, corrupt or not of the model its config.json describes, and naming
// `out` when it cannot be written; nothing is left at `out` then.
HfExportSummary export_hf_checkpoint(const std::string& checkpoint, const std::string& out,
                                     const HfExportOptions& options);

}  // namespace moepeak
