// ZeroTraffic: the ZeRO-3 collectives of one forward/backward pass, hidden behind compute
// (docs/parallelism.md#hiding-zero-3-traffic). A pass uses its gathered groups in a fixed order
// (zero_pass_uses: the embedding, each layer, the head, then the layers in reverse and the
// embedding's gradient); with prefetch depth d >= 1 the all-gathers of the next d uses run on a
// comm stream of their own while the current use computes, and each use's gradient
// reduce-scatter runs there while the next use's backward computes. Depth 0 runs every
// collective on the compute stream where it is needed, one group at a time (the schedule before
// prefetch; what `d >= 1` is bitwise equal to, since every collective and every add is the same
// call on the same bytes, only issued on another stream).
//
//   traffic.begin(groups, zero_pass_uses(L, with_backward));
//   for each use: Group g = traffic.acquire(); ...compute on g...; traffic.release(std::move(g));
//   traffic.end();                 // the compute stream waits for the last reduce-scatter
//
// Memory (the plan: zero_pass_gathered_bytes, the same rule): at acquire(k) the values of use k
// and of the uses gathered ahead of it — k + 1 .. k + d, never past a use that holds prefetch
// (the head, whose moment is the step's largest) — are live; a use's gradient slots are
// allocated at its acquire and freed once its reduce-scatter has finished, with at most one
// reduce-scatter in flight beside the use computing (d >= 1).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/model/zero_params.h"
#include "core/runtime/step_phase.h"

namespace moepeak {

// One use of a gathered group in a pass.
struct ZeroUse {
  int group = 0;  // index into the pass's groups (zero_gather_groups order)
  GatherParts parts = GatherParts::values;
  // While held, nothing after it is gathered ahead (it is released first).
  bool holds_prefetch = false;
};

// The config's default (parallelism.zero_prefetch_depth) and the largest depth accepted.
inline constexpr int kDefaultZeroPrefetchDepth = 1;
inline constexpr int kMaxZeroPrefetchDepth = 8;

// DecoderModel's pass over the L + 2 groups of zero_gather_groups (0 = embed, 1..L = layers,
// L + 1 = final norm and head): forward — embed (values), layers 0..L-1 (values), the head
// (values; with backward values and grads, holding prefetch: the logits' moment gets no extra
// layer); with backward — layers L-1..0 (values and grads), embed (grads only).
std::vector<ZeroUse> zero_pass_uses(int64_t layers, bool with_backward);

// The gathered bytes of a pass at prefetch depth d on the largest rank, as ZeroTraffic holds
// them: weights = the largest sum of the values of an acquired use and of the uses gathered
// ahead of it; grads = the largest of one use's gradient slots plus (d >= 1) those of the use
// before it whose reduce-scatter may still run. Add zero_persistent_bytes for the live sets.
ZeroBytes zero_pass_gathered_bytes(const ModelConfig& model, DType dtype,
                                   const ParallelDegrees& degrees, LmHeadSharding lm_head,
                                   int prefetch_depth, bool with_backward = true);

// The same per phase of a training step (the largest over the uses in it; their max is the
// above): the embedding's uses in `embedding`, a layer's in its pass's attention and experts
// phases, the head's in `head`, none in `optimizer`; a phase a use is acquired in also holds,
// from its start, the gradients the use before left reduce-scattering (its grads above).
std::array<ZeroBytes, kNumStepPhases> zero_phase_gathered_bytes(const ModelConfig& model,
                                                                DType dtype,
                                                                const ParallelDegrees& degrees,
                                                                LmHeadSharding lm_head,
                                                                int prefetch_depth);

class ZeroTraffic {
 public:
  using Group = ZeroParamStore::GatheredGroup;

  // prefetch_depth in [0, kMaxZeroPrefetchDepth]. d >= 1 duplicates the store's data-shard,
  // expert-replica and dense-replica communicators (collective over each, in that order, on every
  // rank) and makes a high-priority comm stream.
  ZeroTraffic(const ZeroParamStore& store, Backend& backend, Stream& compute, int prefetch_depth);
  ~ZeroTraffic();  // abandon()
  ZeroTraffic(const ZeroTraffic&) = delete;
  ZeroTraffic& operator=(const ZeroTraffic&) = delete;

  int prefetch_depth() const { return depth_; }
  // The stream the collectives run on at d >= 1 (tests slow it); nullptr at d = 0.
  Stream* comm_stream() const { return comm_stream_.get(); }

  // Starts a pass over `uses` of `groups` (kept by reference until end()). Error while a pass
  // is open.
  void begin(const std::vector<std::vector<int>>& groups, std::vector<ZeroUse> uses);
  // The pass's next use: its values gathered and its gradient slots zeroed before the compute
  // stream's next work; issues the gathers of the uses after it, up to the depth. Error if the
  // use before is still held or none is left. Collective (every rank, same order).
  Group acquire();
  // Hands back the use last acquired once its last compute is queued: its values are freed; its
  // gradients (if any are summed over ranks) are reduce-scattered into the store's shards —
  // on the comm stream after the compute queued so far (d >= 1), else at once on the compute
  // stream. Collective.
  void release(Group group);
  // After the last use's release: the compute stream waits for every collective of the pass
  // (the shards are complete for what it runs next); everything is freed. Error if uses remain.
  void end();
  bool in_pass() const { return groups_ != nullptr; }
  // On an error path: waits for both streams (dropping their errors: the caller's is the one
  // in flight) and frees what the pass holds. Leaves no pass open.
  void abandon() noexcept;

 private:
  struct Ahead {  // a use whose gather was issued on the comm stream
    size_t use;
    Group group;
    std::unique_ptr<Event> gathered;
  };
  struct Reducing {  // a use's gradients, kept until its reduce-scatter has finished
    Group group;
    std::unique_ptr<Event> reduced;
  };
  void issue(size_t use);
  void retire_oldest_reduce();
  std::unique_ptr<Event> take_event();
  // The comm stream waits for the compute stream's work queued so far.
  void comm_after_compute();

  const ZeroParamStore& store_;
  Backend& backend_;
  Stream& compute_;
  int depth_;
  std::vector<std::unique_ptr<Comm>> owned_comms_;  // data shard, expert replicas, dense replicas
  ZeroComms comms_;
  std::unique_ptr<Stream> comm_stream_;
  std::unique_ptr<Event> compute_now_;
  std::vector<std::unique_ptr<Event>> spare_events_;

  const std::vector<std::vector<int>>* groups_ = nullptr;  // of the open pass
  std::vector<ZeroUse> uses_;
  size_t next_ = 0;
  bool held_ = false;
  std::deque<Ahead> ahead_;
  std::deque<Reducing> reducing_;
};

}  // namespace moepeak
