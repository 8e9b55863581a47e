// LLEP's weight spilling for one exchange (DESIGN.md §7): a helper rank computes rows of an
// expert it does not own with a copy of that expert's weights, sent by the owner; in backward it
// accumulates that expert's weight gradient into its own zeroed buffers and returns them to the
// owner, which adds them (+=) to the expert's gradient — so every expert gradient still ends up,
// summed, on its owner only.
//
//   transfers  llep_transfers(plan): (expert, owner, helper) sorted by (expert, helper)
//   copies     per expert this rank helps with: w1, w3 (F, H), w2 (H, F) in LiveSet::weights,
//              and in backward dw1, dw3, dw2 in LiveSet::grads, zeroed
//
// Messages are point-to-point (send/recv) on the given communicator and stream, issued by every
// rank in the transfers' order, each rank taking part in the pairs that name it: as that order
// is the same everywhere, the earliest pending pair always has both ends waiting on it, so the
// blocking sends and receives cannot deadlock. Three messages per pair: w1, w3, w2 (or dw1, dw3,
// dw2 on the way back).
//
// NOTES: the weights and gradient copies are not dispatch buffers: they are tagged `weights`
// and `grads` (a gathered working copy, like a ZeRO-3 gather) and bounded by the number of
// foreign experts a rank helps with, at most E - E/W per exchange. The caller frees them (reset)
// only after the streams that use them have passed that use.
//
// Test: through tests/parallel/test_llep.cpp (spilled experts' gradients on their owners).
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/llep_plan.h"

namespace moepeak::schedules {

class LlepExpertCopies {
 public:
  // Allocates the copies of the experts `rank` helps with in `transfers` (hidden H, width F).
  // With grads, their gradient buffers too, zeroed on `grad_stream`.
  void allocate(Backend& backend, DType dtype, const std::vector<LlepTransfer>& transfers,
                int64_t rank, int64_t hidden, int64_t ffn, bool with_grads, Stream& grad_stream);
  // Owners send the weights of `local_experts` (experts [first_local, first_local + E/W)) to the
  // helpers; helpers receive them into their copies.
  void send_weights(Comm& comm, Stream& stream, const std::vector<LlepTransfer>& transfers,
                    int64_t rank, int64_t first_local,
                    const std::vector<ExpertWeights>& local_experts) const;
  // Helpers send their gradient copies to the owners; each owner receives a pair's gradients into
  // `scratch` (3 * F * H elements) and adds them to its expert's dw1, dw3, dw2, pair by pair.
  void return_grads(Comm& comm, Stream& stream, const std::vector<LlepTransfer>& transfers,
                    int64_t rank, int64_t first_local,
                    const std::vector<ExpertWeights>& local_experts, const Tensor& scratch) const;

  // The copy of `expert`; throws if this rank does not hold one.
  const ExpertWeights& at(int64_t expert) const;
  size_t size() const { return experts_.size(); }
  void reset();

 private:
  std::vector<int64_t> experts_;  // ascending
  std::vector<ExpertWeights> views_;
  std::vector<OwnedTensor> storage_;
};

// True when `rank` owns an expert that some helper computes in `transfers` (it needs a
// return_grads scratch buffer).
bool llep_owns_a_transfer(const std::vector<LlepTransfer>& transfers, int64_t rank);

}  // namespace moepeak::schedules
