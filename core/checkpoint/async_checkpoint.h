// Asynchronous checkpoints (checkpoint.async = true): the step boundary only copies the state to
// pinned host memory; the files are written by a background thread while training goes on.
//
//   AsyncCheckpointWriter writer(backend);
//   writer.start(folder, "step_00000100", 100, ...);   // collective: snapshot, thread starts
//   ... steps ...  writer.poll(params, optimizer, stream);   // collective, after each step
//   writer.finish(params, optimizer, stream);                 // end of training, stop signal
//
// start(): commits a save still in flight first (the next save waits for the previous one),
// begins the save (begin_checkpoint_save: the metadata of this step boundary, rank 0's fresh
// temporary directory), copies every flat the checkpoint saves — the weights and each optimizer
// state, as this rank holds them — into the snapshot (device -> pinned host, one copy per flat),
// and starts a thread that streams this rank's pieces from the snapshot into its shard file and
// sidecar (write_checkpoint_pieces; no backend call, no collective). poll(): one small all-reduce
// of "my write is done"; once every rank's is, the save is committed (commit_checkpoint_save:
// failures agreed, rank 0 writes the manifest, renames, updates `latest`). finish(): waits for
// this rank's thread and commits. Until a save is committed, `latest` names the previous one, so
// a crash during the background write loses nothing but that save.
//
// Memory: the snapshot, checkpoint_snapshot_bytes (core/model/checkpoint_snapshot.h) of pinned
// host memory — the planner's "checkpoint_snapshot" host term — allocated once (reserve()) and
// reused; plus the write buffer on the background thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/checkpoint/sharded_checkpoint.h"
#include "core/runtime/tensor.h"

namespace moepeak {

class AsyncCheckpointWriter {
 public:
  explicit AsyncCheckpointWriter(Backend& backend) : backend_(backend) {}
  // Joins a background write still running; that save is left uncommitted (its ".tmp_"
  // directory is removed by the next save), as after a crash.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Allocates the snapshot now (the trainer does it at setup, before SCO's "auto" budget takes
  // the rest of the pinned pool); start() does it otherwise. Not collective.
  void reserve(const ZeroParamStore& params, const schedules::Optimizer& optimizer);
  // Collective; see above. `carried`: the run's carried file (sharded_checkpoint.h), linked into
  // the directory when the save commits.
  void start(const std::string& folder, const std::string& dir_name, int64_t step,
             const ModelConfig& model, const ZeroParamStore& params,
             const schedules::Optimizer& optimizer, const DataLoader& loader, Stream& stream,
             int64_t keep_latest, uint64_t write_buffer_bytes,
             const std::optional<CarriedFile>& carried = std::nullopt);
  // Collective; commits the save in flight when every rank's write is done. True when no save is
  // in flight (any more). Every rank must call it at the same points (after each step).
  bool poll(const ZeroParamStore& params, const schedules::Optimizer& optimizer, Stream& stream);
  // Collective; waits for the save in flight, if any, and commits it.
  void finish(const ZeroParamStore& params, const schedules::Optimizer& optimizer, Stream& stream);

  bool in_flight() const { return save_.has_value(); }
  uint64_t snapshot_bytes() const { return snapshot_bytes_; }
  // The step of the last committed save (0 = none yet).
  int64_t last_committed_step() const { return committed_step_; }

 private:
  void commit(const ZeroParamStore& params, const schedules::Optimizer& optimizer, Stream& stream);

  Backend& backend_;
  std::vector<OwnedTensor> snapshot_;  // one pinned block per saved flat
  uint64_t snapshot_bytes_ = 0;
  std::optional<CheckpointSave> save_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::exception_ptr failure_;  // set by the thread before done_
  int64_t committed_step_ = 0;
};

}  // namespace moepeak
