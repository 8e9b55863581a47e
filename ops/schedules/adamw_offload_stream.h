// OffloadStreamAdamW (optimizer.placement = "offload_stream"; paper §4,
// docs/design.md#the-schedules): the fp32 master weights, m and v of this rank's pieces live in
// pinned host memory (HostAdamWState); each step streams them through the device bucket by bucket
// while the gradients stay on the device where backward left them and the working weights are
// refreshed in place.
//
// The flat state buffers (P elements, laid out like the flat weights buffer) are cut into G
// buckets of at most beta elements, [g·beta, min(P, (g+1)·beta)), and bucket g goes through
// staging slot g mod s on three streams of the backend:
//   (i)   host->device   master, m, v of the bucket into the slot       (stream "adamw h2d")
//   (ii)  adamw_fused    the update with the device gradient, and the
//                        working-weight refresh, per piece in the bucket (stream "adamw update")
//   (iii) device->host   master, m, v back to pinned memory             (stream "adamw d2h")
// Events order the stages: (ii) of g waits for (i) of g, (iii) of g for (ii) of g, and (i) of g
// waits for (iii) of g - s — a slot is refilled only after its write-back completed. With s >= 3
// the three stages of consecutive buckets run at once; s = 2 overlaps two of them.
// Padding between pieces is copied along and back unchanged; only the pieces are updated.
//
// Slots live only inside step(): they are allocated (live set `optimizer`) when the step starts,
// after backward has released its activations, and released when every stage has finished, so
// the staging never adds to the forward/backward peak. step() returns after the write-back of
// the last bucket (host-synchronous), with `stream` ordered after the refreshed weights.
//
// Device bytes (live set `optimizer`), exact arena footprints — the function the planner sums:
//   shape   = offload_stream_shape(P, beta, s):  bucket = min(beta, P), buckets G =
//             ceil(P / bucket), slots = min(s, G)
//   bytes   = adamw_offload_stream_bytes(bucket, slots, dtype)
//           = slots · DeviceArena::footprint(3 · bucket · dtype_size(dtype))
// Host bytes: adamw_offload_host_bytes(P, dtype) (12 bytes per element in f32).
//
// Exactness: the update is ops/adamw.h's element-wise kernel (adamw_simd.h), so weights, m and v
// are bitwise those of ResidentAdamW after any number of steps, on one rank or on ZeRO-3 pieces.
// Test: tests/ops/test_adamw_offload.cpp (bitwise vs resident, delayed streams, peak == bytes),
// tests/parallel/test_adamw_offload_parallel.cpp (2 and 4 ranks), tests/model/test_train.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/adamw.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

struct OffloadStreamShape {
  int64_t bucket = 0;   // elements per bucket (the last one may be shorter)
  int64_t buckets = 0;  // G
  int64_t slots = 0;    // staging slots allocated
};

// The bucketing of `elements` flat elements with bucket_params = beta and staging_slots = s
// (beta >= 1, s >= 1; Error otherwise, naming the keys).
OffloadStreamShape offload_stream_shape(int64_t elements, int64_t bucket_params,
                                        int64_t staging_slots);

// Device staging bytes of `slots` slots of `bucket` elements of master, m and v in `dtype`.
uint64_t adamw_offload_stream_bytes(int64_t bucket, int64_t slots, DType dtype);

class OffloadStreamAdamW final : public Optimizer {
 public:
  // flat_values: the buffer every piece's value lies in. Uses config.bucket_params and
  // config.staging_slots.
  OffloadStreamAdamW(Backend& backend, const Tensor& flat_values,
                     std::vector<OptimizerPiece> pieces, const OptimizerConfig& config);
  OffloadStreamAdamW(Backend& backend, const OptimizerParams& params,
                     const OptimizerConfig& config);

  OptimizerPlacement placement() const override { return OptimizerPlacement::offload_stream; }
  void step(int64_t step, double lr, double grad_scale, Stream& stream) override;
  std::vector<OptimizerState> state() const override { return host_.state(); }
  void load_master_from_weights(Stream& stream) override { host_.load_master_from_weights(stream); }

  const OffloadStreamShape& shape() const { return shape_; }
  uint64_t staging_bytes() const;  // adamw_offload_stream_bytes of this shape
  Tensor master() const override { return host_.master(); }  // pinned host, flat
  Tensor m() const { return host_.m(); }
  Tensor v() const { return host_.v(); }

  // The pipeline's streams, for tests that slow one down (CpuStream::set_debug_delay).
  Stream& h2d_stream() { return *h2d_; }
  Stream& update_stream() { return *update_; }
  Stream& d2h_stream() { return *d2h_; }

 private:
  // A piece's elements within a bucket.
  struct Run {
    int64_t at;          // elements from the bucket's start (= from the slot's start)
    Tensor grad, value;  // views of the piece's gradient and working weights for these elements
    bool decay;
  };
  struct Bucket {
    int64_t begin, end;  // elements of the flat buffers
    std::vector<Run> runs;
  };

  // NOTES: declared after host_, so the streams (which drain their queues when destroyed) die
  // before the pinned state their copies touch.
  Backend& backend_;
  OptimizerConfig config_;
  HostAdamWState host_;
  OffloadStreamShape shape_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<Stream> h2d_, update_, d2h_;
  std::unique_ptr<Event> ready_;
  std::vector<std::unique_ptr<Event>> staged_, updated_, written_;  // one of each per slot
};

}  // namespace moepeak::schedules
