// LlepDispatch: least-loaded expert parallelism (arXiv 2601.17111; docs/design.md#the-schedules) —
// the standard expert-parallel dispatch (dispatch_expert_parallel.h) with the rows of hot experts
// spread over the ranks by the LLEP planner (llep_plan.h). All routed rows travel at once, as in
// the standard dispatcher; only *which rank computes them* changes, never which expert does.
//
//   x       (N, H)   this rank's tokens (N may differ per rank)
//   index   (N, k)   i32 top-k GLOBAL expert ids in [0, E), weight (N, k) their weights
//   local_experts    E/W ExpertWeights, this rank's experts in order, with their gradients
//   out     (N, H)   += sum_j weight[n, j] * expert_{index[n, j]}(x[n])
//
// Forward: per-expert row counts are all-gathered (with N); every rank computes the same plan
// (plan_llep with the hard capacity llep_receive_capacity(N_max * k, W, params)); the weights
// of spilled experts go owner -> helper (llep_experts.h); rows travel in LlepRoute's send order
// (destination, expert, token) with one all_to_all_v, are grouped on the compute rank per
// expert (ascending), then source rank, then token — for an expert that is not spilled this is
// exactly ExpertParallelDispatch's order — run the same SwiGLU GEMMs, come back with another
// all_to_all_v and are combined range by range in expert order (LlepRoute::combine_ranges).
// Backward mirrors it; helpers return spilled experts' weight gradients to their owners (+=).
// Experts with biases (gpt-oss) run all_experts_forward's biased MLP with the dispatcher's
// activation wherever their rows are computed: a helper's copy carries the biases, and its bias
// gradients go back with the weights' (llep_experts.h).
//
// Exactness against ExpertParallelDispatch: when no expert is split (the gate kept every expert
// home, or whole experts moved) each expert runs the very GEMMs of the standard dispatcher on the
// same rows in the same order, and out, dx, dweight and weight gradients are bitwise equal. A
// split expert runs its rows in two or more GEMMs: rows agree within an ulp or so (OpenBLAS
// rounds a row by its place in the GEMM's blocking), and its gradient is the owner's share plus
// each helper's (another summation order: fp tolerance).
//
// Memory: the same buffers as ExpertParallelDispatch for the R rows this rank computes, so the
// measured `dispatch` peak is dispatch_expert_parallel_bytes(N, k, H, F, b, R) and never more
// than llep_dispatch_bytes (R at its capacity), biases or not. Helper weight copies are
// `weights`/`grads` (llep_spill_copy_bytes, with the biases' 2 F + H elements when they exist).
//
// Collective: every rank calls forward() and backward() in the same order. The constructor is
// not collective.
//
// Test: ctest -R test_llep (tests/parallel/test_llep.cpp, 2 and 4 ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/llep_plan.h"
#include "ops/schedules/llep_route.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

// The `dispatch` live set bound of LlepDispatch on a rank whose batch has at most `tokens`
// tokens (N_max over the ranks): dispatch_expert_parallel_bytes with R at the receive capacity
// llep_receive_capacity(tokens * top_k, world, params).
uint64_t llep_dispatch_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                             DType dtype, int64_t world, const LlepParams& params);

class LlepDispatch final : public ExpertDispatch {
 public:
  // num_experts is E, the global count; E % W must be 0 (an Error naming E and W otherwise).
  // `activation`: the experts' SwiGLU (default: the plain one).
  LlepDispatch(Backend& backend, Stream& stream, Comm& comm, DType dtype, int64_t num_experts,
               const LlepParams& params = {}, const ops::SwigluParams& activation = {});

  void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
               const std::vector<ExpertWeights>& local_experts, const Tensor& out) override;
  void backward(const Tensor& dout, const std::vector<ExpertWeights>& local_experts,
                const Tensor& dx, const Tensor& dweight) override;
  void release() override;
  // Rows each expert received in the last forward, summed over all ranks (E entries; metrics).
  const std::vector<int64_t>& expert_counts() const override { return counts_; }

  int64_t num_local_experts() const { return local_experts_; }
  // The last forward's plan (the same on every rank) and the rows this rank computed.
  const LlepPlan& plan() const { return plan_; }
  int64_t received_rows() const { return received_rows_; }
  // The receive capacity the plan was held to.
  int64_t capacity() const { return plan_.capacity; }

 private:
  void exchange_rows(const Tensor& send, const std::vector<int64_t>& send_rows, const Tensor& recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);
  const ExpertWeights& weights_of(int64_t expert, const std::vector<ExpertWeights>& local) const;
  // The weights of computed_experts_, in their row order (the groups of expert_offsets_).
  std::vector<ExpertWeights> computed_weights(const std::vector<ExpertWeights>& local) const;

  Backend& backend_;
  Stream& stream_;
  Comm& comm_;
  DType dtype_;
  LlepParams params_;
  ops::SwigluParams activation_;
  int64_t num_experts_, local_experts_, first_expert_;
  int64_t tokens_ = 0, top_k_ = 0, received_rows_ = 0;
  bool have_forward_ = false;
  std::vector<int64_t> counts_;
  LlepPlan plan_;
  LlepRoute route_;
  std::vector<LlepTransfer> transfers_;
  LlepExpertCopies copies_;
  // Experts this rank computes (ascending) and their row ranges in the grouped order.
  std::vector<int64_t> computed_experts_, expert_offsets_;
  OwnedTensor send_token_, send_slot_, send_weight_, y_back_;
  OwnedTensor perm_, inv_perm_, x_rows_, a_, b_;
};

}  // namespace moepeak::schedules
