// Exporting a training checkpoint as a Hugging Face model (`moepeak export`).
//
//   OUT/config.json                        the family's config.json (model_config_json), with
//                                          torch_dtype and dtype = the exported dtype
//   OUT/generation_config.json             {"_from_model_config": true}
//   OUT/model.safetensors.index.json       {"metadata": {"total_size": bytes of the weights},
//                                           "weight_map": {tensor: file}}
//   OUT/model-00001-of-0000n.safetensors   the weights, greedily packed in model order into
//                                          files of at most max_shard_bytes (a tensor larger
//                                          than that gets a file of its own), as transformers'
//                                          save_pretrained does; metadata {"format": "pt"}
//
// The weights are the Hub's tensors (HubLayout, core/model/hub_layout.h): each param as the
// tensor of its own name for mixtral and qwen3_moe; gpt-oss's experts assembled into each
// layer's fused mlp.experts.gate_up_proj (E, H, 2I), down_proj (E, I, H) and their biases.
// transformers' <Family>ForCausalLM.from_pretrained(OUT) loads it; so does `train --init-from
// OUT` (core/checkpoint/hf_import.h). Only the weights are exported (no optimizer state).
//
// The checkpoint's carried files (manifest.json's "carried_files": DeepSeek-V3's MTP layers, which
// the run carried from the Hub checkpoint it started from without training them,
// core/checkpoint/mtp_layers.h) are verified against their checksums, then each of their tensors
// is written after the model's under its own name, in its stored dtype, byte for byte (FP8 and
// its _scale_inv too, though config.json has no quantization_config: the export is `dtype`, and
// transformers has no module for the MTP layers and leaves them out on load, so their dtype does
// not concern it). config.json keeps num_nextn_predict_layers (the family's to_hf_config).
//
// quantize = "mxfp4" (gpt_oss only; `moepeak export --quantize mxfp4`) writes OpenAI's released
// layout instead for the experts' gate_up_proj and down_proj (not their biases): X_blocks (U8
// [E, rows, cols/32, 16]) and X_scales (U8 [E, rows, cols/32]), mxfp4_quantize (OCP rounding,
// core/checkpoint/mxfp4.h) of X with its last two dims swapped ([E, 2I, H] and [E, H, I]), and
// config.json gains {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
// the family's list (family.h)}}; every other tensor is in `dtype`.
//
// Streaming: each tensor goes from the checkpoint's shard files (memory-mapped, every block
// verified: a corrupt checkpoint is an error, never a corrupt export) through staging buffers of
// `buffer_bytes` in all, converted on the way, into its output file; host memory beyond the page
// cache is those buffers, whatever the model's size. NOTES: a fused tensor is assembled a run of
// whole rows of its last dim at a time (a row of gate_up_proj is 2I elements, of down_proj H),
// each expert's part read as runs of its checkpoint tensor, so the bound is the buffer or one row
// per chunk, whichever is larger (a row is a few KiB for any released model); an MXFP4 pair is
// assembled and quantised twice, once for the blocks and once for the scales, so that neither is
// held whole. OUT appears whole or not at all: the files are written into a sibling
// ".tmp_export_*" directory that is renamed to OUT last.
#pragma once

#include <cstdint>
#include <string>

namespace moepeak {

struct HfExportOptions {
  std::string dtype = "BF16";                // safetensors spelling: "BF16" or "F32"
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  uint64_t buffer_bytes = 64ull << 20;       // the staging buffers (at least 4 KiB)
  std::string quantize;                      // "" or "mxfp4" (gpt_oss's experts)
};

struct HfExportSummary {
  std::string checkpoint;       // the step directory exported
  int files = 0;                // model-*-of-* files written
  int64_t tensors = 0;          // safetensors tensors written (an MXFP4 pair counts two)
  int64_t carried_tensors = 0;  // of which from the carried files (MTP layers)
  uint64_t total_bytes = 0;     // metadata.total_size
};

// Exports `checkpoint` (a step directory with manifest.json, or a checkpoint folder whose `latest`
// names one) to `out`, which must not exist (or be an empty directory). Not collective: one
// process reads every shard file. Throws moepeak::Error naming the file and tensor when the
// checkpoint is incomplete, corrupt or not of the model its config.json describes, naming the
// family when quantize is "mxfp4" and the family has no MXFP4 tensors, naming the tensor when
// its rows are not whole blocks of 32 or a weight is not finite, naming the carried file when it
// is missing, corrupt or holds a tensor of the model's names, and naming `out` when it cannot be
// written; nothing is left at `out` then.
HfExportSummary export_hf_checkpoint(const std::string& checkpoint, const std::string& out,
                                     const HfExportOptions& options);

}  // namespace moepeak
