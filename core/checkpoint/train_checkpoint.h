// Training checkpoints and step dumps.
//
// A checkpoint is a directory, written under a temporary name and renamed into place when every
// file in it is complete (each file itself written atomically), so a crash never leaves a
// checkpoint that looks finished but is not:
//
//   <folder>/step_00000100/
//       model.safetensors       weights, Hugging Face Mixtral tensor names, model dtype
//       config.json             MixtralConfig (loads in transformers)
//       rank_00000.safetensors  this rank's optimizer state (flat m, v), metadata: step, data
//                               loader cursor, parameter layout size
//   <folder>/latest             "step_00000100", replaced atomically after the directory
//
// Resuming reads the very bytes that were saved, so the run continues bit for bit.
//
// A step dump (`moepeak train --dump-step DIR`) writes what any Mixtral implementation needs to
// check one training step: model.safetensors (weights before the step), config.json,
// batch.safetensors (input_ids, labels: int64 (B, T)), loss.json, grads.safetensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/data/data_loader.h"
#include "core/model/mixtral_params.h"
#include "ops/schedules/adamw_resident.h"

namespace moepeak {

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Writes the checkpoint of `step` into `folder` (created if needed), updates `latest`, and
// removes the oldest step directories beyond keep_latest.
void save_checkpoint(const std::string& folder, int64_t step, const ModelConfig& model,
                     const ParamStore& params, const schedules::ResidentAdamW& optimizer,
                     const DataLoader& loader, Backend& backend, Stream& stream, int64_t keep_latest);

// The directory `latest` points to, or nullopt when the folder holds no checkpoint.
std::optional<std::string> latest_checkpoint(const std::string& folder);

// Loads weights, optimizer state and the loader cursor; returns the step the checkpoint was taken
// after. Throws moepeak::Error naming the file and tensor when anything does not match this
// model (config, names, shapes, dtypes, sizes).
int64_t load_checkpoint(const std::string& dir, const ModelConfig& model, ParamStore& params,
                        schedules::ResidentAdamW& optimizer, DataLoader& loader, Backend& backend,
                        Stream& stream);

// Writes params (or their gradients) with Hugging Face names to a safetensors file.
void write_params_safetensors(const std::string& path, const ParamStore& params, bool gradients,
                              Backend& backend, Stream& stream);

void write_step_dump(const std::string& dir, const ModelConfig& model, const ParamStore& params,
                     const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                     int64_t batch, int64_t seq_len, double loss, Backend& backend, Stream& stream);

}  // namespace moepeak
