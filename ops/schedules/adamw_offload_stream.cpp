// OffloadStreamAdamW: see adamw_offload_stream.h. Test: ctest -R adamw_offload
#include "ops/schedules/adamw_offload_stream.h"

#include <algorithm>

#include "core/error.h"
#include "ops/adamw_fused.h"

namespace moepeak::schedules {

OffloadStreamShape offload_stream_shape(int64_t elements, int64_t bucket_params,
                                        int64_t staging_slots) {
  MOEPEAK_CHECK(bucket_params >= 1, "optimizer.bucket_params must be >= 1, got ", bucket_params);
  MOEPEAK_CHECK(staging_slots >= 1, "optimizer.staging_slots must be >= 1, got ", staging_slots);
  MOEPEAK_CHECK(elements >= 0, "offload_stream_shape: ", elements, " elements");
  OffloadStreamShape s;
  if (elements == 0) return s;
  s.bucket = std::min(bucket_params, elements);
  s.buckets = (elements + s.bucket - 1) / s.bucket;
  s.slots = std::min(staging_slots, s.buckets);
  return s;
}

uint64_t adamw_offload_stream_bytes(int64_t bucket, int64_t slots, DType dtype) {
  if (bucket <= 0 || slots <= 0) return 0;
  return static_cast<uint64_t>(slots) *
         DeviceArena::footprint(3 * static_cast<uint64_t>(bucket) * dtype_size(dtype));
}

OffloadStreamAdamW::OffloadStreamAdamW(Backend& backend, const Tensor& flat_values,
                                       std::vector<OptimizerPiece> pieces,
                                       const OptimizerConfig& config)
    : backend_(backend),
      config_(config),
      host_(backend, flat_values, std::move(pieces), "OffloadStreamAdamW"),
      shape_(
          offload_stream_shape(flat_values.numel(), config.bucket_params, config.staging_slots)) {
  for (int64_t g = 0; g < shape_.buckets; ++g) {
    Bucket bucket{g * shape_.bucket, std::min(host_.elements(), (g + 1) * shape_.bucket), {}};
    for (const HostAdamWState::Segment& s : host_.segments()) {
      const int64_t lo = std::max(bucket.begin, s.offset);
      const int64_t hi = std::min(bucket.end, s.offset + s.length);
      if (lo >= hi) continue;
      const OptimizerPiece& p = host_.pieces()[static_cast<size_t>(s.piece)];
      // NOTES: the grad may be wider than the working weights (fp32 main grads beside bf16).
      auto view = [&](const Tensor& t) {
        const size_t skip = static_cast<size_t>(lo - s.offset) * dtype_size(t.dtype());
        return Tensor(static_cast<char*>(t.data()) + skip, Shape{hi - lo}, t.dtype(), t.placement(),
                      t.backend());
      };
      bucket.runs.push_back({lo - bucket.begin, view(p.grad), view(p.value), s.decay});
    }
    buckets_.push_back(std::move(bucket));
  }
  h2d_ = backend.create_stream("adamw h2d");
  update_ = backend.create_stream("adamw update");
  d2h_ = backend.create_stream("adamw d2h");
  ready_ = backend.create_event();
  for (int64_t i = 0; i < shape_.slots; ++i) {
    staged_.push_back(backend.create_event());
    updated_.push_back(backend.create_event());
    written_.push_back(backend.create_event());
  }
}

OffloadStreamAdamW::OffloadStreamAdamW(Backend& backend, const OptimizerParams& params,
                                       const OptimizerConfig& config)
    : OffloadStreamAdamW(backend, params.flat_values, params.pieces, config) {}

uint64_t OffloadStreamAdamW::staging_bytes() const {
  return adamw_offload_stream_bytes(shape_.bucket, shape_.slots, host_.dtype());
}

void OffloadStreamAdamW::step(int64_t step, double lr, double grad_scale, Stream& stream) {
  const ops::AdamWHyper hyper = adamw_hyper(config_, step, lr, grad_scale);
  MOEPEAK_CHECK(hyper.step >= 1, "OffloadStreamAdamW: step ", hyper.step, " (steps count from 1)");
  if (shape_.buckets == 0) return;
  const DType dtype = host_.dtype();
  const size_t b = dtype_size(dtype);
  const int64_t beta = shape_.bucket;
  // Slots: (3, beta) each — master, m, v of one bucket.
  std::vector<OwnedTensor> slots;
  for (int64_t i = 0; i < shape_.slots; ++i) {
    slots.push_back(OwnedTensor::device(backend_, Shape{3 * beta}, dtype, LiveSet::optimizer,
                                        "OffloadStreamAdamW staging slot"));
  }
  char* host[3] = {static_cast<char*>(host_.master().data()), static_cast<char*>(host_.m().data()),
                   static_cast<char*>(host_.v().data())};

  // The gradients are complete (and the host state no longer written) at this point of `stream`.
  ready_->record(stream);
  h2d_->wait(*ready_);
  update_->wait(*ready_);
  for (int64_t g = 0; g < shape_.buckets; ++g) {
    const Bucket& bucket = buckets_[static_cast<size_t>(g)];
    const size_t k = static_cast<size_t>(g % shape_.slots);
    char* slot = static_cast<char*>(slots[k].data());
    const size_t bytes = static_cast<size_t>(bucket.end - bucket.begin) * b;
    const size_t at = static_cast<size_t>(bucket.begin) * b;

    // (i) host -> device, once the slot's previous bucket (g - s) has been written back.
    if (g >= shape_.slots) h2d_->wait(*written_[k]);
    for (size_t j = 0; j < 3; ++j) {
      backend_.copy_async(slot + j * beta * b, host[j] + at, bytes, CopyKind::host_to_device,
                          *h2d_);
    }
    staged_[k]->record(*h2d_);

    // (ii) the fused update and working-weight refresh of each piece's run in the bucket.
    update_->wait(*staged_[k]);
    for (const Run& r : bucket.runs) {
      const int64_t n = r.value.numel();
      auto part = [&](size_t j) {
        return Tensor(slot + (j * beta + static_cast<size_t>(r.at)) * b, Shape{n}, dtype,
                      Placement::device, &backend_);
      };
      ops::adamw_fused(part(0), r.grad, part(1), part(2), r.value, hyper, r.decay, *update_);
    }
    updated_[k]->record(*update_);

    // (iii) device -> host write-back.
    d2h_->wait(*updated_[k]);
    for (size_t j = 0; j < 3; ++j) {
      backend_.copy_async(host[j] + at, slot + j * beta * b, bytes, CopyKind::device_to_host,
                          *d2h_);
    }
    written_[k]->record(*d2h_);
  }
  const size_t last = static_cast<size_t>((shape_.buckets - 1) % shape_.slots);
  stream.wait(*updated_[last]);
  stream.wait(*written_[last]);
  // NOTES: every use of the slots has finished once the three streams are idle (the last
  // write-back follows every update and copy); only then may the slots go back to the arena.
  // Synchronising the streams (not just the events) also surfaces an error raised on any of them.
  h2d_->synchronize();
  update_->synchronize();
  d2h_->synchronize();
}

}  // namespace moepeak::schedules
