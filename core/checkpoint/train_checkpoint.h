// Training checkpoints and step dumps, on any number of ranks.
//
// A checkpoint is a directory written by every rank in parallel, sharded as the ranks hold the
// model (core/checkpoint/sharded_checkpoint.h: one file of pieces per rank, manifest.json with
// checksums, config.json), renamed into place when complete, then named by <folder>/latest. It
// resumes in any layout on any number of ranks that can train the model: each rank reads the
// byte ranges of what it holds; on the same layout those are the very bytes saved, so the run
// continues bit for bit. load_checkpoint also reads the earlier whole-tensor format
// (model.safetensors with every weight, optimizer.safetensors with "exp_avg.<name>" and
// "exp_avg_sq.<name>" and the step and data cursor in its metadata).
//
// The optimizer state goes through schedules::Optimizer (ops/schedules/optimizer.h), whatever
// its placement (device memory, or pinned host memory for the offload placements): every
// placement saves the same tensors, so a checkpoint of one resumes under any other; a master the
// checkpoint does not carry is re-derived from the loaded weights.
//
// A step dump (`moepeak train --dump-step DIR`) writes what any implementation of the family
// needs to check one training step: model.safetensors (weights before the step), config.json,
// batch.safetensors (input_ids, labels: int64 (B, T), the global batch), loss.json,
// grads.safetensors (the full gradients, summed over ranks), the weights and gradients as the
// Hub's tensors (HubLayout, core/model/hub_layout.h: gpt-oss's experts fused per layer, as
// transformers' GptOssExperts holds them). Collective; every tensor is gathered and rank 0
// writes (a dump is for models small enough to check by hand).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/checkpoint/sharded_checkpoint.h"
#include "core/data/data_loader.h"
#include "core/model/zero_params.h"
#include "ops/schedules/optimizer.h"

namespace moepeak {

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Writes the checkpoint of `step` into `folder` (created if needed), updates `latest`, and
// removes the oldest step directories beyond keep_latest. Collective: if any rank fails to
// write, every rank throws. Each rank's host memory for it: `write_buffer_bytes`
// (checkpoint.write_buffer). `carried`: the run's carried file (the MTP layers it does not
// train, core/checkpoint/mtp_layers.h), linked into the checkpoint (sharded_checkpoint.h).
void save_checkpoint(const std::string& folder, int64_t step, const ModelConfig& model,
                     const ZeroParamStore& params, const schedules::Optimizer& optimizer,
                     const DataLoader& loader, Stream& stream, int64_t keep_latest,
                     uint64_t write_buffer_bytes = 64ull << 20,
                     const std::optional<CarriedFile>& carried = std::nullopt);

// The directory `latest` points to, or nullopt when the folder holds no checkpoint.
std::optional<std::string> latest_checkpoint(const std::string& folder);

// Loads weights, optimizer state and the loader cursor; returns the step the checkpoint was taken
// after. Throws moepeak::Error naming the file and tensor when anything does not match this
// model (config, names, shapes, dtypes, sizes).
// Not collective.
int64_t load_checkpoint(const std::string& dir, const ModelConfig& model, ZeroParamStore& params,
                        schedules::Optimizer& optimizer, DataLoader& loader, Stream& stream);

// Writes the full params (or their gradients) as the Hub's tensors (HubLayout) to a safetensors
// file. Collective (the tensors are gathered on every rank); rank 0 writes.
void write_params_safetensors(const std::string& path, const ZeroParamStore& params, bool gradients,
                              Stream& stream);

// Collective; rank 0 writes (see above). input_ids, labels: the global batch (B*T), as the model
// saw it. With packed documents (training.document_mask / reset_position_ids) also the positions
// RoPE took, "position_ids" (B*T i64), and with the mask each position's document start,
// "document_starts" (B*T i32), in batch.safetensors; empty spans are not written.
void write_step_dump(const std::string& dir, const ModelConfig& model, const ZeroParamStore& params,
                     const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                     int64_t batch, int64_t seq_len, double loss, Stream& stream,
                     std::span<const int64_t> positions = {},
                     std::span<const int32_t> document_starts = {});

}  // namespace moepeak
