// SCO, selective checkpoint offload (paper §3, docs/design.md#the-schedules): the bounded schedule
// of the `boundaries` live set. Under per-layer checkpointing one (N, H) tensor per layer — its
// input — lives from forward to its recompute in backward. SCO walks the layers in forward order
// and offloads each input that still fits the host budget (the set S, always the first |S| layers)
// to the pinned NUMA-local pool; the others stay on device as in standard checkpointing
// (checkpoint_standard.h, the reference it is tested against). Tests: ctest -R test_sco;
// bench: moepeak bench sco.
//
//   forward   keep(l): a copy stream waits for the compute stream, then copies layer l's input
//             device -> host while layer l runs; forward_done(l) frees the device buffer only
//             once that copy's event has completed.
//   backward  restore(l): the compute stream waits for layer l's copy host -> device; after
//             layer l's recompute is submitted, prefetch(l-1) starts layer l-1's copy, which
//             runs while layer l's backward does; release(l) frees layer l's buffer.
//   The final hidden state (the last layer's output) stays on device, as under standard.
//
// Sizes (the functions below: the schedule picks S and sizes its host block with them, the
// planner will sum them, test_sco holds the measured peaks equal to them); b the bytes per value,
// fp = DeviceArena::footprint(N*H*b) one boundary on device:
//   host        = PinnedPool::footprint(|S| * N*H*b)      one pinned block for S (0 if S is empty)
//   boundaries  = max(2, L - |S| + 1) * fp                when |S| >= 1; (L + 1) * fp when S is
//                                                         empty (= boundaries_standard_bytes)
// The 2 are: in forward, layer l's input beside its output; in backward, layer l's restored
// input beside layer l-1's (prefetched), or beside layer l's recomputed output, never all three
// (that is why prefetch(l-1) waits for the recompute to be submitted). The kept layers |S|..L-1
// and the final hidden state are live together at the end of forward: L - |S| + 1.
//
// NOTES: SCO is per rank and needs no communication: every rank offloads its own N tokens' inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/runtime/backend.h"
#include "ops/schedules/checkpoint_standard.h"

namespace moepeak::schedules {

// Pinned host bytes SCO holds for `offloaded` boundaries of (N, H) values: one pool block.
uint64_t sco_host_bytes(int64_t offloaded, int64_t tokens, int64_t hidden, DType dtype);
// |S|: the number of layers, from layer 0 on, whose inputs fit `host_budget` together.
int64_t sco_offloaded_layers(int64_t layers, int64_t tokens, int64_t hidden, DType dtype,
                             uint64_t host_budget);
// S as a mask over the layers: offloaded[l] for l in [0, layers).
std::vector<bool> sco_offload_set(int64_t layers, int64_t tokens, int64_t hidden, DType dtype,
                                  uint64_t host_budget);
// Peak bytes of the device `boundaries` live set with `offloaded` = |S| of `layers` layers.
uint64_t sco_boundaries_bytes(int64_t layers, int64_t offloaded, int64_t tokens, int64_t hidden,
                              DType dtype);
// The host budget SCO works with: `configured` (schedules.sco_host_budget) or, for "auto"
// (nullopt), what the pinned pool can still give: its budget (runtime.pinned_memory) less the
// bytes live in it now. NOTES: the probe (`moepeak probe`, to come) will assign each rank its host
// budget; "auto" then becomes that budget, and this fallback stays for runs without a probe file.
uint64_t sco_host_budget(std::optional<uint64_t> configured, const PinnedPool& pool);

class ScoBoundaries final : public CheckpointBoundaries {
 public:
  // host_budget: bytes, or nullopt for "auto" (sco_host_budget, resolved at every begin()).
  // `compute` is the stream the model's layers run on; the copies get a stream of their own.
  ScoBoundaries(Backend& backend, Stream& compute, std::optional<uint64_t> host_budget);
  ~ScoBoundaries() override;

  void begin(int layers, const Shape& shape, DType dtype, bool for_backward) override;
  Tensor keep(int layer, OwnedTensor input) override;
  void forward_done(int layer) override;
  void prefetch(int layer) override;
  Tensor restore(int layer) override;
  void release(int layer) override;
  void end() override;
  void discard() noexcept override;

  // |S| of the current (or last) step.
  int64_t offloaded_layers() const { return offloaded_count_; }
  // The stream the copies run on (tests slow it with CpuStream::set_debug_delay).
  Stream& copy_stream() { return *copy_; }

 private:
  struct Boundary {
    bool offloaded = false;  // in S
    OwnedTensor device;      // (N, H): keep() .. forward_done() and prefetch() .. release()
    Tensor host;             // (N, H) in the pinned block, when offloaded
    bool on_host = false;    // the device -> host copy has been submitted
    bool restoring = false;  // the host -> device copy has been submitted
    std::unique_ptr<Event> copied_to_host, copied_to_device;
  };
  Boundary& at(int layer);
  // Makes work submitted to the copy stream from now on wait for everything submitted to the
  // compute stream so far.
  void copy_after_compute();

  Backend& backend_;
  Stream& compute_;
  std::optional<uint64_t> host_budget_;
  std::unique_ptr<Stream> copy_;
  std::unique_ptr<Event> compute_mark_;
  Shape shape_;
  DType dtype_ = DType::f32;
  bool for_backward_ = true;
  int64_t offloaded_count_ = 0;
  OwnedTensor host_block_;  // (|S|, N, H) pinned, live set `boundaries` of the pool
  std::vector<Boundary> layers_;
};

}  // namespace moepeak::schedules
