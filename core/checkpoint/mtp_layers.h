// Multi-token-prediction (MTP) layers: carried, untrained, from the Hugging Face checkpoint a run
// starts from to every checkpoint it saves and to its export, byte for byte.
//
// DeepSeek-V3's released checkpoints hold num_nextn_predict_layers (1) MTP modules after the
// decoder's layers, under model.layers.{L}.* for L = num_hidden_layers, ...: embed_tokens, enorm,
// hnorm, eh_proj, shared_head.norm, shared_head.head and a whole decoder layer's tensors, in their
// stored dtypes (the FP8 ones with their _scale_inv). moepeak does not train them (the decoder
// does not run them; transformers' DeepseekV3ForCausalLM drops them on load too), but a model
// exported without them could no longer serve them (speculative decoding in vLLM and SGLang).
//
//   <checkpoint folder>/mtp_layers.safetensors             the run's copy, made at import
//   <checkpoint folder>/step_N/mtp_layers.safetensors      a hard link to it in every checkpoint,
//                                                          listed in manifest.json's
//                                                          "carried_files" with its checksums
//   OUT/model-0000k-of-0000n.safetensors                   `moepeak export` copies its tensors
//                                                          in, names, dtypes and bytes unchanged
//
// NOTES: why a file of their own, linked: the tensors are of dtypes the checkpoint's shard files
// do not hold (F8_E4M3) and no rank holds them in memory, so they stay what they were in the Hub's
// files — a safetensors file, each tensor's bytes as stored. It is written once, when the run
// starts from the Hub checkpoint (rank 0 streams the tensors from its files through a bounded
// buffer), and its size and block checksums are computed then; a save then links it into the
// step directory (CarriedFile, sharded_checkpoint.h: no bytes read or written, whatever its size,
// 14 GB for DeepSeek-V3) and lists those checksums in the manifest, so the export can prove the
// bytes it copies. The run's copy sits in the checkpoint folder, where the removal of old steps
// (keep_latest) never reaches; a resumed run links the resumed checkpoint's file there again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/sharded_checkpoint.h"

namespace moepeak {

inline constexpr const char* kMtpLayersFile = "mtp_layers.safetensors";

// The MTP layer a tensor belongs to: L of "model.layers.{L}.…" when layers <= L < layers +
// mtp_layers (layers: num_hidden_layers; mtp_layers: num_nextn_predict_layers), -1 otherwise.
int64_t mtp_layer_of(std::string_view tensor, int64_t layers, int64_t mtp_layers);

// The tensors of hf's MTP layers as the files store them (an FP8 weight and its _scale_inv, an
// MXFP4 pair's halves), sorted.
std::vector<std::string> mtp_stored_names(const HfCheckpoint& hf, const ModelConfig& model);

// Writes hf's MTP tensors (mtp_stored_names) into the safetensors file `path`, each with its
// name, dtype, shape and bytes as stored, through a buffer of at most `buffer_bytes`, atomically
// (metadata {"format": "pt"}); returns it as a CarriedFile named kMtpLayersFile, with its size
// and checksums of blocks of `block_bytes` (read back from the file written). nullopt, and nothing
// written, when the model has no MTP layers or the checkpoint holds none of their tensors. Not
// collective. Throws moepeak::Error naming the file on a read or write error (nothing is left at
// `path` then).
std::optional<CarriedFile> write_mtp_layers(const HfCheckpoint& hf, const ModelConfig& model,
                                            const std::string& path,
                                            uint64_t block_bytes = kCheckpointBlockBytes,
                                            uint64_t buffer_bytes = 64ull << 20);

// The carried MTP file of the checkpoint step directory `dir` (its manifest's "carried_files"
// entry kMtpLayersFile), linked to `<folder>/mtp_layers.safetensors` (link_or_copy_file) and
// returned as that; nullopt when the checkpoint carries none (or is of the earlier whole-tensor
// format). Throws moepeak::Error naming the file when it is missing or not the size the manifest
// says. Not collective.
std::optional<CarriedFile> relink_mtp_layers(const std::string& dir, const std::string& folder);

// Collective: rank 0 writes `<folder>/mtp_layers.safetensors` from `hf` (write_mtp_layers), every
// rank sharing its outcome (run_and_agree). The CarriedFile on rank 0 (the rank that commits a
// save), nullopt on the others and when there is nothing to carry.
std::optional<CarriedFile> carry_mtp_layers(const HfCheckpoint& hf, const ModelConfig& model,
                                            const std::string& folder, const ZeroParamStore& params,
                                            Stream& stream);
// Collective: the same for a run resumed from the checkpoint `dir` (relink_mtp_layers).
std::optional<CarriedFile> carry_mtp_layers_of_checkpoint(const std::string& dir,
                                                          const std::string& folder,
                                                          const ZeroParamStore& params,
                                                          Stream& stream);

// The checksums of the file at `path` in blocks of `block_bytes`, as `name`. Throws naming it.
ShardFileInfo checksum_file(const std::string& path, const std::string& name, uint64_t block_bytes);

// Throws moepeak::Error naming the file and the block unless the file `info.name` of `dir` has
// the size and block checksums `info` says.
void verify_carried_file(const std::string& dir, const ShardFileInfo& info);

}  // namespace moepeak
