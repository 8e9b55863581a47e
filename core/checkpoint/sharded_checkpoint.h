// Sharded training checkpoints: every rank writes its own pieces, in parallel; any layout reads.
//
//   <folder>/step_00000100/
//       shard-00000.bin ...   rank r's pieces of the weights and of every optimizer state, back
//                             to back (core/checkpoint/shard_io.h), one file per rank
//       manifest.json         which bytes of which file hold which elements of which tensor,
//                             with XXH3 block checksums (core/checkpoint/shard_manifest.h), and
//                             the metadata: step, data-loader cursor, layout, optimizer placement
//       config.json           the family's config.json of the model (transformers' spelling)
//       mtp_layers.safetensors  only when the run carries tensors it does not train (DeepSeek-V3's
//                             MTP layers, core/checkpoint/mtp_layers.h): a CarriedFile, below
//   <folder>/latest           "step_00000100", replaced atomically after the directory
//
// Tensors: the weights under their Hugging Face names in the model dtype, each optimizer state
// as "<state>.<name>" ("exp_avg.", "exp_avg_sq.", "master." for a master apart from the weights)
// in its own dtype. What a rank writes of a tensor is its ZeRO-3 piece
// (ZeroParamStore::stored_range): a dense shard (on dense-replica rank 0 only), its experts'
// pieces, its LM-head vocabulary rows; over the job the pieces tile every tensor once.
//
// Saving is collective and atomic as a directory: rank 0 makes a fresh ".tmp_step_N", every rank
// streams its pieces into its file through one host buffer of `write_buffer_bytes` (device data
// is copied straight into that buffer, piece by piece: a save's host memory per rank is that
// buffer, nothing else) and records its slices in a sidecar "shard-0000r.json"; rank 0 then
// writes manifest.json from the sidecars (the commit point inside the directory), config.json,
// renames the directory into place and updates `latest`. A failure on any rank is every rank's
// error; a crash or kill at any moment leaves `latest` and the previous checkpoint as they were
// (a stale ".tmp_" directory is removed by the next save).
//
// Loading is not collective: each rank reads only the byte ranges of the elements it stores in
// the layout it runs (memory-mapped, every block it touches verified), so a checkpoint saved on W
// ranks in one layout resumes on W' ranks in another; in the same layout it reads back the very
// bytes saved. Anything missing, truncated, corrupt, or of another shape or dtype is an error
// naming the file and tensor.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/shard_io.h"
#include "core/checkpoint/shard_manifest.h"
#include "core/data/data_loader.h"
#include "core/model/zero_params.h"
#include "ops/schedules/optimizer.h"

namespace moepeak {

// The checksum blocks of a checkpoint's files (the manifest's block_bytes).
inline constexpr uint64_t kCheckpointBlockBytes = 8ull << 20;

// A file a run carries into every checkpoint it saves, unchanged: tensors it does not train
// (DeepSeek-V3's MTP layers, core/checkpoint/mtp_layers.h). A save puts the file at `path` into
// the step directory as info.name — a hard link, or a copy where the filesystem cannot link — and
// lists `info` (its size and block checksums, computed once when the run made the file) in the
// manifest's "carried_files". NOTES: the file is never read by a save, so carrying costs a link
// per checkpoint whatever its size; every link is to the same bytes, which are never written in
// place (files are replaced by rename), so they stay what `info` says; the export verifies them.
struct CarriedFile {
  std::string path;
  ShardFileInfo info;
};

// Puts the file `from` at `to` as the same bytes: a hard link, or a copy where the filesystem
// cannot link; an existing `to` is replaced atomically (through a temporary name beside it), and
// nothing is done when `to` already is `from`. Throws moepeak::Error naming both on failure.
void link_or_copy_file(const std::filesystem::path& from, const std::filesystem::path& to);

// See above. Collective. Removes the oldest step directories beyond keep_latest. `carried` goes
// into the directory as a CarriedFile (rank 0's is used: rank 0 commits the save).
void save_sharded_checkpoint(const std::string& folder, const std::string& dir_name, int64_t step,
                             const ModelConfig& model, const ZeroParamStore& params,
                             const schedules::Optimizer& optimizer, const DataLoader& loader,
                             Stream& stream, int64_t keep_latest, uint64_t write_buffer_bytes,
                             const std::optional<CarriedFile>& carried = std::nullopt);

// ---- the phases of a save (save_sharded_checkpoint runs them in a row; an asynchronous save,
// core/checkpoint/async_checkpoint.h, runs the middle one on a background thread) ----

// A save in progress: where it goes and the metadata of its step boundary (step, data cursor,
// layout, placement), taken when it began.
struct CheckpointSave {
  std::string folder, dir_name;
  int64_t step = 0, keep_latest = 0;
  uint64_t write_buffer_bytes = 0;
  ModelConfig model;
  nlohmann::json metadata;
  std::optional<CarriedFile> carried;
  std::filesystem::path final_dir() const;
  std::filesystem::path tmp_dir() const;  // ".tmp_<dir_name>"
  std::string what() const;               // "checkpoint <final_dir>", for errors
};

// Collective: records the metadata and makes a fresh temporary directory (rank 0).
CheckpointSave begin_checkpoint_save(const std::string& folder, const std::string& dir_name,
                                     int64_t step, const ModelConfig& model,
                                     const ZeroParamStore& params,
                                     const schedules::Optimizer& optimizer,
                                     const DataLoader& loader, Stream& stream, int64_t keep_latest,
                                     uint64_t write_buffer_bytes,
                                     const std::optional<CarriedFile>& carried = std::nullopt);

// Copies elements [offset, offset + count) of the stored range of `param` in saved flat number
// `flat` (checkpoint_flats order) to host `dst`.
using PieceCopy =
    std::function<void(int flat, int param, int64_t offset, int64_t count, void* dst)>;

// The flats a checkpoint saves, in order: the weights, then each optimizer state.
std::vector<Tensor> checkpoint_flats(const ZeroParamStore& params,
                                     const schedules::Optimizer& optimizer);

// Not collective, no backend calls of its own: streams this rank's pieces (those it
// writes_checkpoint) from `copy` into its shard file and sidecar in the temporary directory,
// through the save's write buffer. Throws on a write error.
void write_checkpoint_pieces(const CheckpointSave& save, const ZeroParamStore& params,
                             const schedules::Optimizer& optimizer, const PieceCopy& copy);

// Collective: every rank's write outcome (`write_failure`: this rank's, or null) becomes every
// rank's; then rank 0 merges the sidecars into manifest.json, puts the carried file into the
// directory (link_or_copy_file), writes config.json, renames the directory into place, updates
// `latest` and removes old steps.
void commit_checkpoint_save(const CheckpointSave& save, const ZeroParamStore& params,
                            const schedules::Optimizer& optimizer, Stream& stream,
                            std::exception_ptr write_failure);

// Runs `work` where `here` is true and makes its outcome every rank's (collective): a rank whose
// work failed rethrows its own error, the others throw one naming `what`, so no rank goes on to
// a collective another will not join.
void run_and_agree(const ZeroParamStore& params, Stream& stream, const std::string& what, bool here,
                   const std::function<void()>& work);

// A sharded checkpoint read tensor by tensor, whole (export, tests): the validated manifest and
// any tensor's full bytes, every block verified. Not collective.
class ShardedCheckpoint {
 public:
  explicit ShardedCheckpoint(std::string dir);
  const ShardManifest& manifest() const { return manifest_; }
  const nlohmann::json& metadata() const { return manifest_.metadata; }
  // The full tensor `name` (numel * dtype_size bytes, row-major). Error naming it if absent.
  std::vector<char> read(const std::string& name);
  // Elements [begin, end) of `tensor` (one of the manifest's) into `dest`.
  void read(const ShardTensor& tensor, int64_t begin, int64_t end, void* dest) {
    reader_->read(tensor, begin, end, dest);
  }

 private:
  std::string dir_;
  ShardManifest manifest_;
  std::unique_ptr<ShardReader> reader_;
};

// `dir` holds a manifest.json.
bool is_sharded_checkpoint(const std::string& dir);

// Loads weights, optimizer state and the loader cursor from a sharded checkpoint; returns the
// step it was taken after. The caller has compared its config.json with the model
// (load_checkpoint, core/checkpoint/train_checkpoint.h).
int64_t load_sharded_checkpoint(const std::string& dir, ZeroParamStore& params,
                                schedules::Optimizer& optimizer, DataLoader& loader,
                                Stream& stream);

}  // namespace moepeak
