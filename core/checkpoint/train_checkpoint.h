// Training checkpoints and step dumps, on any number of ranks.
//
// A checkpoint is a directory, written under a temporary name and renamed into place when every
// file in it is complete (each file itself written atomically), so a crash never leaves a
// checkpoint that looks finished but is not:
//
//   <folder>/step_00000100/
//       model.safetensors      the full weights, Hugging Face Mixtral tensor names, model dtype
//       config.json            MixtralConfig (loads in transformers)
//       optimizer.safetensors  AdamW's m and v of every parameter, full tensors named
//                              "exp_avg.<name>" and "exp_avg_sq.<name>"; metadata: step, data
//                              loader cursor, the world size that saved it
//   <folder>/latest            "step_00000100", replaced atomically after the directory
//
// Every tensor is whole (gathered from the ZeRO-3 shards and the experts' owners), so the
// checkpoint does not depend on the rank count: a run saved on W ranks resumes on any W' that can
// train the model (each rank keeps its part of every tensor). Resuming on the same W reads the
// very bytes that were saved, so the run continues bit for bit. Saving is collective (every rank
// gathers, rank 0 writes; the node running rank 0 needs host memory for the model and its
// optimizer state); loading is not (each rank reads the files, which must be on a file system
// every rank sees).
//
// The optimizer state goes through schedules::Optimizer (ops/schedules/optimizer.h), whatever
// its placement: state in device memory is gathered with ZeroParamStore::gather_full; state in
// pinned host memory (the offload placements) is staged piece by piece through a device
// `workspace` buffer into the same collectives (NCCL reads device memory only; MPI on the CPU
// backend is given host memory either way) and loaded straight into the host buffers. Every
// placement saves the same tensors, so a checkpoint of one resumes under any other; a master the
// checkpoint does not carry is re-derived from the loaded weights.
//
// A step dump (`moepeak train --dump-step DIR`) writes what any Mixtral implementation needs to
// check one training step: model.safetensors (weights before the step), config.json,
// batch.safetensors (input_ids, labels: int64 (B, T), the global batch), loss.json,
// grads.safetensors (the full gradients, summed over ranks). Collective; rank 0 writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/data/data_loader.h"
#include "core/model/zero_params.h"
#include "ops/schedules/optimizer.h"

namespace moepeak {

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Writes the checkpoint of `step` into `folder` (created if needed), updates `latest`, and
// removes the oldest step directories beyond keep_latest. Collective: if rank 0 fails to write,
// every rank throws.
void save_checkpoint(const std::string& folder, int64_t step, const ModelConfig& model,
                     const ZeroParamStore& params, const schedules::Optimizer& optimizer,
                     const DataLoader& loader, Stream& stream, int64_t keep_latest);

// The directory `latest` points to, or nullopt when the folder holds no checkpoint.
std::optional<std::string> latest_checkpoint(const std::string& folder);

// Loads weights, optimizer state and the loader cursor; returns the step the checkpoint was taken
// after. Throws moepeak::Error naming the file and tensor when anything does not match this
// model (config, names, shapes, dtypes, sizes).
// Not collective.
int64_t load_checkpoint(const std::string& dir, const ModelConfig& model, ZeroParamStore& params,
                        schedules::Optimizer& optimizer, DataLoader& loader, Stream& stream);

// Writes the full params (or their gradients) with Hugging Face names to a safetensors file.
// Collective (the tensors are gathered on every rank); rank 0 writes.
void write_params_safetensors(const std::string& path, const ZeroParamStore& params, bool gradients,
                              Stream& stream);

// Collective; rank 0 writes (see above). input_ids, labels: the global batch (B*T).
void write_step_dump(const std::string& dir, const ModelConfig& model, const ZeroParamStore& params,
                     const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                     int64_t batch, int64_t seq_len, double loss, Stream& stream);

}  // namespace moepeak
