// LlepExpertCopies: spilled experts' weights to helpers, their gradients back (see the header).
// Test: through tests/parallel/test_llep.cpp
#include "ops/schedules/llep_experts.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/fill.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak::schedules {

bool llep_may_spill(int64_t world, const LlepParams& params) {
  // 1e-9: the imbalance is a double quotient (two roundings), so lambda == W may still spill.
  return world > 1 && !(params.lambda > static_cast<double>(world) * (1.0 + 1e-9));
}

int64_t llep_max_copies(int64_t num_experts, int64_t world, int64_t capacity, int64_t plans,
                        const LlepParams& params) {
  MOEPEAK_CHECK(
      world >= 1 && num_experts >= 0 && num_experts % world == 0 && capacity >= 0 && plans >= 0,
      "llep_max_copies: E = ", num_experts, ", W = ", world, ", capacity ", capacity, ", plans ",
      plans);
  if (!llep_may_spill(world, params)) return 0;
  const int64_t foreign = num_experts - num_experts / world;
  const int64_t per_plan = std::min(capacity, llep_helped_limit(num_experts, world, params));
  // plans * per_plan, saturating.
  if (plans == 0 || per_plan == 0) return 0;
  if (per_plan >= (foreign + plans - 1) / plans) return foreign;
  return std::min(foreign, plans * per_plan);
}

int64_t llep_expert_elements(int64_t hidden, int64_t ffn, bool biases) {
  return 3 * ffn * hidden + (biases ? 2 * ffn + hidden : 0);
}

LlepSpillCopyBytes llep_spill_copy_bytes(int64_t num_experts, int64_t world, int64_t hidden,
                                         int64_t ffn, DType dtype, int64_t capacity, int64_t plans,
                                         const LlepParams& params, bool biases) {
  MOEPEAK_CHECK(hidden >= 0 && ffn >= 0, "llep_spill_copy_bytes: hidden ", hidden, ", ffn ", ffn);
  LlepSpillCopyBytes b;
  b.copies = llep_max_copies(num_experts, world, capacity, plans, params);
  if (b.copies == 0) return b;
  const uint64_t elements = static_cast<uint64_t>(llep_expert_elements(hidden, ffn, biases));
  const uint64_t one = DeviceArena::footprint(elements * dtype_size(dtype));
  const uint64_t one_grad = DeviceArena::footprint(elements * dtype_size(main_grad_dtype(dtype)));
  b.weights = static_cast<uint64_t>(b.copies) * one;
  b.grads = static_cast<uint64_t>(b.copies) * one_grad;
  b.scratch = one_grad;
  return b;
}

namespace {

// An expert's packed parts in message and buffer order: w1, w3, w2, then (biases) b1, b3, b2 —
// or, with `grads`, the gradients of those.
std::vector<const Tensor*> parts_of(const ExpertWeights& w, bool biases, bool grads) {
  if (grads) {
    if (biases) return {&w.dw1, &w.dw3, &w.dw2, &w.db1, &w.db3, &w.db2};
    return {&w.dw1, &w.dw3, &w.dw2};
  }
  if (biases) return {&w.w1, &w.w3, &w.w2, &w.b1, &w.b3, &w.b2};
  return {&w.w1, &w.w3, &w.w2};
}

// The views of one packed buffer of llep_expert_elements(H, F, biases) elements, in parts_of's
// order: w1, w3 (F, H), w2 (H, F), b1, b3 (F), b2 (H), into `w`'s weights (or gradients).
void unpack(const Tensor& flat, int64_t hidden, int64_t ffn, bool biases, bool grads,
            ExpertWeights& w) {
  const int64_t FH = ffn * hidden;
  Tensor& w1 = grads ? w.dw1 : w.w1;
  Tensor& w3 = grads ? w.dw3 : w.w3;
  Tensor& w2 = grads ? w.dw2 : w.w2;
  w1 = flat.rows(0, FH).reshape(Shape{ffn, hidden});
  w3 = flat.rows(FH, 2 * FH).reshape(Shape{ffn, hidden});
  w2 = flat.rows(2 * FH, 3 * FH).reshape(Shape{hidden, ffn});
  if (!biases) return;
  const int64_t at = 3 * FH;
  (grads ? w.db1 : w.b1) = flat.rows(at, at + ffn);
  (grads ? w.db3 : w.b3) = flat.rows(at + ffn, at + 2 * ffn);
  (grads ? w.db2 : w.b2) = flat.rows(at + 2 * ffn, at + 2 * ffn + hidden);
}

}  // namespace

void LlepExpertCopies::allocate(Backend& backend, DType dtype,
                                const std::vector<LlepTransfer>& transfers, int64_t rank,
                                int64_t hidden, int64_t ffn, bool biases, bool with_grads,
                                Stream& grad_stream, int64_t max_copies) {
  reset();
  biases_ = biases;
  for (const LlepTransfer& t : transfers) {
    if (t.helper == rank) experts_.push_back(t.expert);
  }
  // NOTES: the invariant behind the plan's spill terms (llep_spill_copy_bytes): never more
  // copies than llep_max_copies.
  MOEPEAK_CHECK(static_cast<int64_t>(experts_.size()) <= max_copies, "llep: rank ", rank,
                " would hold ", experts_.size(), " expert copies, above the bound ", max_copies,
                " (llep_max_copies)");
  const int64_t elements = llep_expert_elements(hidden, ffn, biases);
  for (size_t i = 0; i < experts_.size(); ++i) {
    // w1, w3, w2 [b1, b3, b2] in one buffer each for the values and for the gradients.
    OwnedTensor w =
        OwnedTensor::device(backend, Shape{elements}, dtype, LiveSet::weights, "llep expert copy");
    ExpertWeights v;
    unpack(w.view(), hidden, ffn, biases, false, v);
    storage_.push_back(std::move(w));
    if (with_grads) {
      OwnedTensor g = OwnedTensor::device(backend, Shape{elements}, main_grad_dtype(dtype),
                                          LiveSet::grads, "llep expert gradient copy");
      ops::fill(g, 0.0, grad_stream);
      unpack(g.view(), hidden, ffn, biases, true, v);
      storage_.push_back(std::move(g));
    }
    views_.push_back(v);
  }
}

void LlepExpertCopies::send_weights(Comm& comm, Stream& stream,
                                    const std::vector<LlepTransfer>& transfers, int64_t rank,
                                    int64_t first_local,
                                    const std::vector<ExpertWeights>& local_experts) const {
  // NOTES: one batched exchange, so an owner's copies to several helpers (and a helper's from
  // several owners) overlap; each list keeps the transfers' order, the same on every rank, which
  // is the order messages between two ranks are matched in.
  std::vector<PeerMessage> sends, recvs;
  std::optional<DType> dtype;
  for (const LlepTransfer& t : transfers) {
    const bool owner = t.owner == rank;
    if (!owner && t.helper != rank) continue;
    const ExpertWeights& w =
        owner ? local_experts.at(static_cast<size_t>(t.expert - first_local)) : at(t.expert);
    MOEPEAK_CHECK(w.has_biases() == biases_, "llep: expert ", t.expert,
                  w.has_biases() ? " has biases but the copies were allocated without"
                                 : " has no biases but the copies were allocated with them");
    for (const Tensor* p : parts_of(w, biases_, false)) {
      MOEPEAK_CHECK(!dtype || *dtype == p->dtype(), "llep: expert weights of two dtypes (",
                    dtype_name(*dtype), ", ", dtype_name(p->dtype()), ") in one exchange");
      dtype = p->dtype();
      (owner ? sends : recvs)
          .push_back({p->data(), static_cast<size_t>(p->numel()),
                      static_cast<int>(owner ? t.helper : t.owner)});
    }
  }
  if (dtype) comm.exchange(sends, recvs, *dtype, stream);
}

void LlepExpertCopies::return_grads(Comm& comm, Stream& stream,
                                    const std::vector<LlepTransfer>& transfers, int64_t rank,
                                    int64_t first_local,
                                    const std::vector<ExpertWeights>& local_experts,
                                    const Tensor& scratch) const {
  for (const LlepTransfer& t : transfers) {
    if (t.helper == rank) {
      for (const Tensor* p : parts_of(at(t.expert), biases_, true)) {
        comm.send(p->data(), static_cast<size_t>(p->numel()), p->dtype(), static_cast<int>(t.owner),
                  stream);
      }
    } else if (t.owner == rank) {
      const ExpertWeights& w = local_experts.at(static_cast<size_t>(t.expert - first_local));
      const int64_t F = w.w1.size(0), H = w.w1.size(1);
      MOEPEAK_CHECK(w.has_biases() == biases_, "llep: expert ", t.expert,
                    w.has_biases() ? " has biases but the copies were allocated without"
                                   : " has no biases but the copies were allocated with them");
      const int64_t elements = llep_expert_elements(H, F, biases_);
      MOEPEAK_CHECK(scratch.numel() >= elements, "llep: gradient scratch ", scratch.str(),
                    " for experts of (", F, ", ", H, ")", biases_ ? " with biases" : "");
      ExpertWeights returned;
      unpack(scratch.reshape(Shape{scratch.numel()}).rows(0, elements), H, F, biases_, true,
             returned);
      const std::vector<const Tensor*> got = parts_of(returned, biases_, true);
      const std::vector<const Tensor*> mine = parts_of(w, biases_, true);
      for (const Tensor* p : got) {
        comm.recv(p->data(), static_cast<size_t>(p->numel()), p->dtype(),
                  static_cast<int>(t.helper), stream);
      }
      for (size_t i = 0; i < got.size(); ++i) ops::add(*mine[i], *got[i], *mine[i], stream);
    }
  }
}

const ExpertWeights& LlepExpertCopies::at(int64_t expert) const {
  auto it = std::lower_bound(experts_.begin(), experts_.end(), expert);
  MOEPEAK_CHECK(it != experts_.end() && *it == expert, "llep: no copy of expert ", expert,
                " on this rank");
  return views_[static_cast<size_t>(it - experts_.begin())];
}

void LlepExpertCopies::reset() {
  biases_ = false;
  experts_.clear();
  views_.clear();
  storage_.clear();
}

bool llep_owns_a_transfer(const std::vector<LlepTransfer>& transfers, int64_t rank) {
  return std::any_of(transfers.begin(), transfers.end(),
                     [&](const LlepTransfer& t) { return t.owner == rank; });
}

}  // namespace moepeak::schedules
