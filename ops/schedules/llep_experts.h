// LLEP's weight spilling for one exchange (docs/design.md#the-schedules): a helper rank computes
// rows of an expert it does not own with a copy of that expert's weights, sent by the owner; in
// backward it accumulates that expert's weight gradient into its own zeroed buffers and returns
// them to the owner, which adds them (+=) to the expert's gradient — so every expert gradient still
// ends up, summed, on its owner only.
//
//   transfers  llep_transfers(plan): (expert, owner, helper) sorted by (expert, helper)
//   copies     per expert this rank helps with: w1, w3 (F, H), w2 (H, F) [and with biases b1, b3
//              (F), b2 (H)] in one LiveSet::weights buffer, and in backward dw1, dw3, dw2 [db1,
//              db3, db2] in one LiveSet::grads buffer, zeroed (llep_expert_elements each)
//
// Messages are point-to-point (send/recv) on the given communicator and stream, issued by every
// rank in the transfers' order, each rank taking part in the pairs that name it: as that order
// is the same everywhere, the earliest pending pair always has both ends waiting on it, so the
// blocking sends and receives cannot deadlock. Three messages per pair: w1, w3, w2 (or dw1, dw3,
// dw2 on the way back); six with biases: then b1, b3, b2 (db1, db3, db2) follow. Every rank
// holds the same model, so owner and helper agree on whether the experts have biases.
//
// NOTES: the weights and gradient copies are not dispatch buffers: they are tagged `weights`
// and `grads` (a gathered working copy, like a ZeRO-3 gather) and bounded by the number of
// foreign experts a rank helps with, llep_max_copies (below; at most E - E/W per allocation).
// allocate() checks that bound (MOEPEAK_CHECK), so the plan's llep_spill_copy_bytes terms can
// never be exceeded. The caller frees them (reset) only after the streams that use them have
// passed that use.
//
// Test: through tests/parallel/test_llep.cpp (spilled experts' gradients on their owners);
// llep_spill_copy_bytes in tests/plan/test_plan.cpp, against spilling runs in test_plan_parallel.
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/llep_plan.h"

namespace moepeak::schedules {

// Whether any plan_llep with the dispatchers' capacity (llep_receive_capacity) can spill on W
// ranks. Not when lambda > W (1 + 1e-9), the margin covering the rounding of the double max/mean:
// the imbalance max_native / (T / W) is at most W, so the gate never opens, and
// floor(lambda * M) >= W * M makes the capacity W * M >= T >= any native load, so the hard cap
// never forces it either.
bool llep_may_spill(int64_t world, const LlepParams& params);

// The most foreign experts one rank can hold copies of at once (one LlepExpertCopies), when every
// plan behind the copies has hard capacity <= `capacity` rows per rank and `plans` plans feed one
// allocation (LLEP: 1, one exchange; PipelinedLLEP: K, the chunks of a pass, whose spills are
// all sent before chunk 0, each chunk's plan told what the earlier ones spilled):
//   copies = 0                                        if !llep_may_spill(W, params)
//                                                     (W == 1, lambda > W)
//          = min(E - E/W, plans * min(capacity, H))   otherwise,
// H = llep_helped_limit(E, W, params). Derivation: a rank holds a copy of expert e iff it is a
// helper of e, i.e. some piece of e with >= 1 row is on it and e is not one of its own E/W
// experts: at most E - E/W experts. Each plan adds at most H experts a rank did not already
// help (plan_llep's limit, held by its capacity fill too), and at most `capacity` (every piece
// counts against the hard cap, so one plan puts at most `capacity` rows, hence at most that many
// distinct experts, on a rank); K plans, K times that. min_tokens_per_gemm does not tighten it:
// an expert's remainder and the forced pieces are exempt.
int64_t llep_max_copies(int64_t num_experts, int64_t world, int64_t capacity, int64_t plans,
                        const LlepParams& params);

// The elements of one expert's packed copy (or of its gradients, or of an owner's scratch for
// them): w1, w3 (F, H) and w2 (H, F), and with biases b1, b3 (F) and b2 (H):
//   3 F H (+ 2 F + H with biases).
int64_t llep_expert_elements(int64_t hidden, int64_t ffn, bool biases);

// The device bytes of one rank's spill copies at their peak, arena footprints (fp) included,
// with P = llep_expert_elements(H, F, biases) (3 F H, or 3 F H + 2 F + H with biases):
//   weights  copies * fp(P b)   (the w1, w3, w2 [b1, b3, b2] copies; `weights`)
//   grads    copies * fp(P b_g) (their gradient buffers, backward; `grads`)
//   scratch  fp(P b_g) if copies > 0, else 0   (the owner's buffer for returned gradients,
//            one per backward call, in `grads`)
// (b_g: main_grad_dtype's bytes, 4 for bf16 — a spilled expert's gradient is summed over chunks
// on its helper and sent back in fp32, like the owner's own).
// with copies = llep_max_copies(E, W, capacity, plans, params). Used by the plan (core/plan/).
struct LlepSpillCopyBytes {
  int64_t copies = 0;
  uint64_t weights = 0, grads = 0, scratch = 0;
};
LlepSpillCopyBytes llep_spill_copy_bytes(int64_t num_experts, int64_t world, int64_t hidden,
                                         int64_t ffn, DType dtype, int64_t capacity, int64_t plans,
                                         const LlepParams& params, bool biases = false);

class LlepExpertCopies {
 public:
  // Allocates the copies of the experts `rank` helps with in `transfers` (hidden H, width F),
  // with bias copies when `biases` (the experts have them: ExpertWeights::has_biases). With
  // grads, their gradient buffers too (main_grad_dtype(dtype)), zeroed on `grad_stream`.
  // Throws if they are more than `max_copies` (llep_max_copies of the plans behind `transfers`).
  void allocate(Backend& backend, DType dtype, const std::vector<LlepTransfer>& transfers,
                int64_t rank, int64_t hidden, int64_t ffn, bool biases, bool with_grads,
                Stream& grad_stream, int64_t max_copies);
  // Owners send the weights (and biases) of `local_experts` (experts [first_local,
  // first_local + E/W)) to the helpers; helpers receive them into their copies.
  void send_weights(Comm& comm, Stream& stream, const std::vector<LlepTransfer>& transfers,
                    int64_t rank, int64_t first_local,
                    const std::vector<ExpertWeights>& local_experts) const;
  // Helpers send their gradient copies to the owners; each owner receives a pair's gradients into
  // `scratch` (llep_expert_elements(H, F, biases) elements) and adds them to its expert's dw1,
  // dw3, dw2 (and db1, db3, db2), pair by pair.
  void return_grads(Comm& comm, Stream& stream, const std::vector<LlepTransfer>& transfers,
                    int64_t rank, int64_t first_local,
                    const std::vector<ExpertWeights>& local_experts, const Tensor& scratch) const;

  // The copy of `expert`; throws if this rank does not hold one.
  const ExpertWeights& at(int64_t expert) const;
  size_t size() const { return experts_.size(); }
  void reset();

 private:
  std::vector<int64_t> experts_;  // ascending
  bool biases_ = false;
  std::vector<ExpertWeights> views_;
  std::vector<OwnedTensor> storage_;
};

// True when `rank` owns an expert that some helper computes in `transfers` (it needs a
// return_grads scratch buffer).
bool llep_owns_a_transfer(const std::vector<LlepTransfer>& transfers, int64_t rank);

}  // namespace moepeak::schedules
