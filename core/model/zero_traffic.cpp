// ZeroTraffic: a pass's ZeRO-3 gathers ahead of use and reduce-scatters behind it, on a comm
// stream of their own (see zero_traffic.h).
#include "core/model/zero_traffic.h"

#include <algorithm>

#include "core/error.h"

namespace moepeak {

std::vector<ZeroUse> zero_pass_uses(int64_t layers, bool with_backward) {
  const int L = static_cast<int>(layers);
  const int head = L + 1;
  std::vector<ZeroUse> uses;
  uses.push_back({0, GatherParts::values});
  for (int l = 0; l < L; ++l) uses.push_back({1 + l, GatherParts::values});
  if (!with_backward) {
    uses.push_back({head, GatherParts::values});
    return uses;
  }
  uses.push_back({head, GatherParts::values_and_grads, /*holds_prefetch=*/true});
  for (int l = L - 1; l >= 0; --l) uses.push_back({1 + l, GatherParts::values_and_grads});
  uses.push_back({0, GatherParts::grads});
  return uses;
}

namespace {

// The last use gathered ahead when use k is acquired (ZeroTraffic::acquire's rule): up to
// k + depth, stopping at the first use that holds prefetch; k itself if it holds prefetch.
size_t window_end(const std::vector<ZeroUse>& uses, size_t k, int depth) {
  size_t end = k;
  if (uses[k].holds_prefetch) return end;
  for (size_t j = k + 1; j < uses.size() && j <= k + static_cast<size_t>(depth); ++j) {
    end = j;
    if (uses[j].holds_prefetch) break;
  }
  return end;
}

// What each use of the pass holds gathered at its acquire: its values and those gathered ahead,
// its gradient slots and (d >= 1) those of the use before whose reduce-scatter may still run.
std::vector<ZeroBytes> zero_use_gathered_bytes(const ModelConfig& model, DType dtype,
                                               const ParallelDegrees& degrees,
                                               LmHeadSharding lm_head, int prefetch_depth,
                                               bool with_backward) {
  const auto [first, last] = zero_local_experts(model, degrees, 0);
  const ParamLayout& layout = cached_param_layout(model);
  const std::vector<std::vector<int>> groups = zero_gather_groups(layout, lm_head, first, last);
  const std::vector<ZeroUse> uses = zero_pass_uses(model.num_hidden_layers, with_backward);
  std::vector<ZeroBytes> bytes;
  for (const ZeroUse& u : uses) {
    bytes.push_back(zero_gathered_bytes(model, layout, dtype, degrees, groups[u.group], u.parts));
  }
  std::vector<ZeroBytes> held(uses.size());
  const bool overlapped = prefetch_depth > 0 && degrees.world > 1;
  uint64_t reducing = 0;  // the gradient slots of the last use released with gradients
  for (size_t k = 0; k < uses.size(); ++k) {
    const size_t end = overlapped ? window_end(uses, k, prefetch_depth) : k;
    for (size_t j = k; j <= end; ++j) held[k].weights += bytes[j].weights;
    if (bytes[k].grads == 0) continue;
    held[k].grads = bytes[k].grads + (overlapped ? reducing : 0);
    reducing = bytes[k].grads;
  }
  return held;
}

void keep_larger(ZeroBytes& most, const ZeroBytes& b) {
  most.weights = std::max(most.weights, b.weights);
  most.grads = std::max(most.grads, b.grads);
}

}  // namespace

ZeroBytes zero_pass_gathered_bytes(const ModelConfig& model, DType dtype,
                                   const ParallelDegrees& degrees, LmHeadSharding lm_head,
                                   int prefetch_depth, bool with_backward) {
  ZeroBytes most;
  for (const ZeroBytes& b :
       zero_use_gathered_bytes(model, dtype, degrees, lm_head, prefetch_depth, with_backward)) {
    keep_larger(most, b);
  }
  return most;
}

std::array<ZeroBytes, kNumStepPhases> zero_phase_gathered_bytes(const ModelConfig& model,
                                                                DType dtype,
                                                                const ParallelDegrees& degrees,
                                                                LmHeadSharding lm_head,
                                                                int prefetch_depth) {
  const std::vector<ZeroBytes> held =
      zero_use_gathered_bytes(model, dtype, degrees, lm_head, prefetch_depth, true);
  const std::vector<ZeroUse> uses = zero_pass_uses(model.num_hidden_layers, true);
  const int head = static_cast<int>(model.num_hidden_layers) + 1;
  std::array<ZeroBytes, kNumStepPhases> most{};
  auto add = [&](StepPhase ph, const ZeroBytes& b) {
    keep_larger(most[static_cast<size_t>(ph)], b);
  };
  bool backward = false;  // the uses after the head's
  const bool overlapped = prefetch_depth > 0 && degrees.world > 1;
  for (size_t k = 0; k < uses.size(); ++k) {
    // NOTES: the model enters a use's phase before it acquires the use, while (d >= 1) the
    // gradients the use before left are still being reduce-scattered (held[k - 1].grads: two
    // uses' when the older has not been retired yet, which only the acquire does). In a backward
    // layer's phases they are counted with that layer anyway; the embedding's gradient use at the
    // end of the pass starts with layer 0's and layer 1's in flight, which can exceed its own and
    // layer 0's (DeepSeek-V3's dense first layer and shared experts; Mixtral's layers on these
    // tests' tiny vocabulary). At d = 0 a release frees its gradients at once.
    const ZeroBytes entering{0, overlapped && k > 0 ? held[k - 1].grads : 0};
    if (uses[k].group == 0) {
      add(StepPhase::embedding, held[k]);
      add(StepPhase::embedding, entering);
    } else if (uses[k].group == head) {
      add(StepPhase::head, held[k]);
      add(StepPhase::head, entering);
      backward = true;
    } else {
      add(attention_phase(backward), held[k]);
      add(attention_phase(backward), entering);
      add(experts_phase(backward), held[k]);
    }
  }
  return most;
}

ZeroTraffic::ZeroTraffic(const ZeroParamStore& store, Backend& backend, Stream& compute,
                         int prefetch_depth)
    : store_(store), backend_(backend), compute_(compute), depth_(prefetch_depth) {
  MOEPEAK_CHECK(depth_ >= 0 && depth_ <= kMaxZeroPrefetchDepth,
                "parallelism.zero_prefetch_depth = ", depth_, " must be in [0, ",
                kMaxZeroPrefetchDepth, "]");
  comms_ = store.comms();
  if (depth_ == 0) return;
  // NOTES: duplicates, not the groups themselves: a communicator is used from one stream only
  // (comm.h), and the compute stream keeps the groups for the model's own collectives.
  for (Comm** c : {&comms_.data_shard, &comms_.expert_replicas, &comms_.dense_replicas}) {
    owned_comms_.push_back((*c)->duplicate());
    *c = owned_comms_.back().get();
  }
  comm_stream_ = backend.create_stream("zero-3 traffic", StreamPriority::high);
  compute_now_ = backend.create_event();
}

ZeroTraffic::~ZeroTraffic() { abandon(); }

std::unique_ptr<Event> ZeroTraffic::take_event() {
  if (spare_events_.empty()) return backend_.create_event();
  std::unique_ptr<Event> e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

void ZeroTraffic::comm_after_compute() {
  compute_now_->record(compute_);
  comm_stream_->wait(*compute_now_);
}

void ZeroTraffic::begin(const std::vector<std::vector<int>>& groups, std::vector<ZeroUse> uses) {
  MOEPEAK_CHECK(groups_ == nullptr, "ZeroTraffic::begin: a pass is already open");
  for (const ZeroUse& u : uses) {
    MOEPEAK_CHECK(u.group >= 0 && u.group < static_cast<int>(groups.size()),
                  "ZeroTraffic::begin: no group ", u.group, " of ", groups.size());
  }
  groups_ = &groups;
  uses_ = std::move(uses);
  next_ = 0;
  held_ = false;
}

void ZeroTraffic::issue(size_t use) {
  // NOTES: the gather writes freshly allocated memory whose previous owner may have been read by
  // compute work still queued (the arena frees on the host): the comm stream first waits for the
  // compute stream's work so far. Every gather issued during use k's acquire therefore overlaps
  // use k's compute, not use k - 1's.
  comm_after_compute();
  const ZeroUse& u = uses_[use];
  Ahead a{use, store_.gather_values((*groups_)[u.group], u.parts, *comm_stream_, comms_),
          take_event()};
  a.gathered->record(*comm_stream_);
  ahead_.push_back(std::move(a));
}

void ZeroTraffic::retire_oldest_reduce() {
  // NOTES: the compute stream waits for the reduce-scatter before its gradient slots go back to
  // the arena, so any next owner (on either stream: the comm stream always waits for compute
  // first) runs after it.
  Reducing r = std::move(reducing_.front());
  reducing_.pop_front();
  compute_.wait(*r.reduced);
  spare_events_.push_back(std::move(r.reduced));
}

ZeroTraffic::Group ZeroTraffic::acquire() {
  MOEPEAK_CHECK(groups_ != nullptr, "ZeroTraffic::acquire outside a pass");
  MOEPEAK_CHECK(!held_, "ZeroTraffic::acquire: the use before is still held (release it first)");
  MOEPEAK_CHECK(next_ < uses_.size(), "ZeroTraffic::acquire: the pass's ", uses_.size(),
                " uses are done");
  const size_t k = next_++;
  const ZeroUse& u = uses_[k];
  held_ = true;
  if (!comm_stream_) return store_.gather((*groups_)[u.group], compute_, u.parts);
  if (ahead_.empty()) issue(k);
  MOEPEAK_CHECK(ahead_.front().use == k, "ZeroTraffic: use ", ahead_.front().use,
                " gathered ahead, but use ", k, " is acquired");
  Ahead a = std::move(ahead_.front());
  ahead_.pop_front();
  compute_.wait(*a.gathered);  // the values are complete before compute reads them
  spare_events_.push_back(std::move(a.gathered));
  if (u.parts != GatherParts::values) {
    // NOTES: at most one reduce-scatter in flight beside this use: the gradient slots of older
    // uses are freed before this use's are allocated (the plan's grads bound counts two).
    while (reducing_.size() > 1) retire_oldest_reduce();
    a.group.allocate_grads(compute_);
  }
  // The uses gathered ahead are always the ones right after k, none past a use that holds
  // prefetch: issue the rest of k's window (the planner's rule, window_end).
  const size_t last = ahead_.empty() ? k : ahead_.back().use;
  for (size_t j = last + 1; j <= window_end(uses_, k, depth_); ++j) issue(j);
  return std::move(a.group);
}

void ZeroTraffic::release(Group group) {
  MOEPEAK_CHECK(held_, "ZeroTraffic::release: no use is held");
  held_ = false;
  const bool reduce = group.parts() != GatherParts::values && group.has_reduced_grads();
  if (!comm_stream_) {
    if (reduce) group.reduce_scatter_grads(compute_);
    return;  // freed here: every use of its buffers is on the compute stream
  }
  group.release_values();  // the next owner waits for compute (issue) or follows it
  if (!reduce) return;
  comm_after_compute();  // the gradients are complete
  group.reduce_scatter_grads(*comm_stream_, comms_);
  Reducing r{std::move(group), take_event()};
  r.reduced->record(*comm_stream_);
  reducing_.push_back(std::move(r));
}

void ZeroTraffic::end() {
  MOEPEAK_CHECK(groups_ != nullptr, "ZeroTraffic::end outside a pass");
  MOEPEAK_CHECK(!held_ && next_ == uses_.size() && ahead_.empty(),
                "ZeroTraffic::end: ", uses_.size() - next_, " of the pass's ", uses_.size(),
                " uses not run");
  // One comm stream: its last reduce's event covers every earlier one.
  if (!reducing_.empty()) compute_.wait(*reducing_.back().reduced);
  for (Reducing& r : reducing_) spare_events_.push_back(std::move(r.reduced));
  reducing_.clear();
  groups_ = nullptr;
  uses_.clear();
}

void ZeroTraffic::abandon() noexcept {
  for (Stream* s : {comm_stream_.get(), &compute_}) {
    try {
      if (s) s->synchronize();
    } catch (...) {
    }
  }
  ahead_.clear();
  reducing_.clear();
  groups_ = nullptr;
  uses_.clear();
  held_ = false;
  next_ = 0;
}

}  // namespace moepeak
