// Asynchronous checkpoints: snapshot at the step boundary, files on a thread (async_checkpoint.h).
#include "core/checkpoint/async_checkpoint.h"

#include <cstring>

#include "core/comm/comm.h"
#include "core/error.h"
#include "core/model/checkpoint_snapshot.h"

namespace moepeak {

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointWriter::reserve(const ZeroParamStore& params,
                                    const schedules::Optimizer& optimizer) {
  if (!snapshot_.empty()) return;
  const std::vector<Tensor> flats = checkpoint_flats(params, optimizer);
  std::vector<DType> dtypes;
  for (const Tensor& f : flats) dtypes.push_back(f.dtype());
  MOEPEAK_CHECK(dtypes == checkpoint_flat_dtypes(params.dtype()),
                "the saved flats' dtypes differ from what the planner counts "
                "(checkpoint_flat_dtypes)");
  const int64_t elements = params.flat_values().numel();
  for (const Tensor& f : flats) {
    MOEPEAK_CHECK(f.numel() == elements, "a saved flat is not laid out like the weights");
    snapshot_.push_back(OwnedTensor::pinned(backend_, Shape{elements}, f.dtype(),
                                            LiveSet::optimizer, "checkpoint snapshot"));
  }
  snapshot_bytes_ = checkpoint_snapshot_bytes(elements, dtypes);
}

void AsyncCheckpointWriter::start(const std::string& folder, const std::string& dir_name,
                                  int64_t step, const ModelConfig& model,
                                  const ZeroParamStore& params,
                                  const schedules::Optimizer& optimizer, const DataLoader& loader,
                                  Stream& stream, int64_t keep_latest, uint64_t write_buffer_bytes,
                                  const std::optional<CarriedFile>& carried) {
  finish(params, optimizer, stream);  // the next save waits for the previous one
  reserve(params, optimizer);
  const std::vector<Tensor> flats = checkpoint_flats(params, optimizer);
  save_ = begin_checkpoint_save(folder, dir_name, step, model, params, optimizer, loader, stream,
                                keep_latest, write_buffer_bytes, carried);
  // reserve() checked the flats' dtypes against the planner's when it made the snapshot.
  MOEPEAK_CHECK(snapshot_.size() == flats.size(), "the checkpoint snapshot has ", snapshot_.size(),
                " flats, the save ", flats.size());
  // The snapshot: each flat as it is at this step boundary.
  for (size_t k = 0; k < flats.size(); ++k) {
    if (flats[k].placement() == Placement::host) {
      stream.synchronize();  // the host state is current
      std::memcpy(snapshot_[k].data(), flats[k].data(), flats[k].nbytes());
    } else {
      backend_.copy_async(snapshot_[k].data(), flats[k].data(), flats[k].nbytes(),
                          CopyKind::device_to_host, stream);
    }
  }
  stream.synchronize();

  done_.store(false);
  failure_ = nullptr;
  std::vector<const char*> bases;
  for (const OwnedTensor& t : snapshot_) bases.push_back(static_cast<const char*>(t.data()));
  // NOTES: the thread touches only the snapshot (host memory nothing else writes until the next
  // start(), which joins it first), the files and const accessors of the store and optimizer
  // (layout, piece offsets, the flats' dtypes): never the backend, a stream or a communicator.
  writer_ = std::thread([this, &params, &optimizer, bases] {
    try {
      const std::vector<Tensor> views = checkpoint_flats(params, optimizer);
      write_checkpoint_pieces(
          *save_, params, optimizer,
          [&](int flat, int param, int64_t offset, int64_t count, void* dst) {
            const size_t b = dtype_size(views[flat].dtype());
            std::memcpy(dst,
                        bases[flat] + static_cast<size_t>(params.piece_offset(param) + offset) * b,
                        static_cast<size_t>(count) * b);
          });
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  });
}

bool AsyncCheckpointWriter::poll(const ZeroParamStore& params,
                                 const schedules::Optimizer& optimizer, Stream& stream) {
  if (!save_) return true;
  double not_done[1] = {done_.load(std::memory_order_acquire) ? 0.0 : 1.0};
  if (params.world_size() > 1) {
    all_reduce_host(params.comm(), params.backend(), stream, not_done, ReduceOp::max);
  }
  if (not_done[0] != 0) return false;
  commit(params, optimizer, stream);
  return true;
}

void AsyncCheckpointWriter::finish(const ZeroParamStore& params,
                                   const schedules::Optimizer& optimizer, Stream& stream) {
  if (!save_) return;
  commit(params, optimizer, stream);
}

void AsyncCheckpointWriter::commit(const ZeroParamStore& params,
                                   const schedules::Optimizer& optimizer, Stream& stream) {
  if (writer_.joinable()) writer_.join();
  const CheckpointSave save = std::move(*save_);
  save_.reset();
  commit_checkpoint_save(save, params, optimizer, stream, failure_);
  committed_step_ = save.step;
}

}  // namespace moepeak
