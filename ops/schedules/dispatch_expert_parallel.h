// The standard expert-parallel dispatch (docs/design.md#parallel-layout): rank r of W owns experts
// [r*E/W, (r+1)*E/W); every routed token travels to its expert's rank with one all_to_all_v, runs
// the same SwiGLU expert GEMMs as StandardDispatch there (all_experts_forward: biases and the
// activation included, so the owner's bias gradients sum its rows as the standard's do), and
// comes back with another
// all_to_all_v to be combined on the rank that owns the token. Expert weights and their gradients
// are not ZeRO-sharded: each expert lives, and accumulates its gradient, on its owner only.
//
//   x       (N, H)   this rank's tokens (N = N_local), normalised hidden states
//   index   (N, k)   i32 top-k GLOBAL expert ids in [0, E), weight (N, k) their weights
//   local_experts    E/W ExpertWeights, this rank's experts in order (w1, w3 (F, H), w2 (H, F))
//   out     (N, H)   += sum_j weight[n, j] * expert_{index[n, j]}(x[n])
//
// Row orders: a rank sends its M = N*k routed rows ordered by destination rank, then expert, then
// token (which is StandardDispatch's expert-major order, since experts are numbered by owner).
// The owner receives R rows in arrival order (source rank, local expert, token) and permutes
// them so each local expert's rows are contiguous with sources in rank order; as token slices
// are contiguous per rank, that is the global token order a single rank would use. So per-token
// outputs, dx and dweight come out of the same per-row arithmetic as StandardDispatch on one rank,
// and each expert sees the same rows in the same order.
//
// This is the schedule whose receive buffers grow with routing skew: R is whatever the router
// sends this rank (up to W*N*k when every token picks this rank's experts), and everything is
// allocated exactly for it. Buffers come from the arena under LiveSet::dispatch (rows,
// permutations) and LiveSet::workspace (the small count exchange).
//
// Collective: every rank calls forward() and backward() in the same order (they run
// all_to_all_v and all_reduce on `comm`, on `stream`). An argument error found before the first
// collective (a bad expert id, a wrong number of local experts) throws on the rank that saw it
// only, so the others would block: such errors are bugs, not conditions to recover from.
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch_standard.h"

namespace moepeak::schedules {

// Peak bytes of the `dispatch` live set on one rank for N = tokens_local tokens with top-k
// routing (M = N*k rows sent) when the rank receives `received_rows` (R) rows: the largest of
//   forward:  send permutation (token, slot i32, weight) + receive permutation (2 x R i32)
//             + x_rows, a, b kept, plus the largest of {g, y_rows} (GEMMs), {y_rows, y_arrival}
//             (back to arrival order) and {y_arrival, y_back (M, H)} (the return trip);
//   backward: on entry the saved buffers with y_back, plus the row-weight gradient (M); then
//             dy (M, H) and dy_recv (R, H) during the exchange; then dy_rows, dx_rows and the
//             SwiGLU temporaries g, dg, da, db (R, F) during the expert GEMMs;
// each buffer rounded to the arena's alignment. The planner passes the worst case
// R = W * N * k (every token to one rank's experts); tests pass the R they measured.
uint64_t dispatch_expert_parallel_bytes(int64_t tokens_local, int64_t top_k, int64_t hidden,
                                        int64_t ffn, DType dtype, int64_t received_rows);

// all_to_all_v of rows with `width` elements each on `stream`: `send_rows[p]` rows to peer p from
// consecutive blocks of `send`, `recv_rows[p]` from peer p into consecutive blocks of `recv`.
// Throws (naming `who` and both tensors) unless the row counts cover `send` and `recv` exactly. The
// one row exchange of every expert-parallel dispatcher (this one, LLEP, PipelinedLLEP).
void exchange_rows(Comm& comm, Stream& stream, DType dtype, const char* who, const Tensor& send,
                   const std::vector<int64_t>& send_rows, const Tensor& recv,
                   const std::vector<int64_t>& recv_rows, int64_t width);

// The combine's backward on a source rank, once its rows' outputs y_back (M, H) have come back
// in send order: dy = weight * dout per sent row, written over y_back, and dweight (N, k) (=)
// from the per-row dot products dout . y, gathered through send_slot; the dots sit in an (M)
// `dispatch` buffer while it runs. send_token, send_slot (M) i32 and send_weight (M) are the
// forward's send permutation. Shared by the expert-parallel dispatchers that return whole outputs
// (this one and LLEP).
void combine_backward_on_source(Backend& backend, Stream& stream, DType dtype, const Tensor& dout,
                                const Tensor& y_back, const Tensor& send_token,
                                const Tensor& send_weight, const Tensor& send_slot,
                                const Tensor& dweight);

class ExpertParallelDispatch final : public ExpertDispatch {
 public:
  // num_experts is E, the global count; E % W must be 0 (an Error naming E and W otherwise).
  // `activation`: the experts' SwiGLU (default: the plain one).
  ExpertParallelDispatch(Backend& backend, Stream& stream, Comm& comm, DType dtype,
                         int64_t num_experts, const ops::SwigluParams& activation = {});

  // Forward: out += MoE(x). Keeps what backward needs until backward() or release().
  void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
               const std::vector<ExpertWeights>& local_experts, const Tensor& out) override;
  // Backward from dout (N, H): dx (N, H) +=, dweight (N, k) =, local expert weight grads +=.
  void backward(const Tensor& dout, const std::vector<ExpertWeights>& local_experts,
                const Tensor& dx, const Tensor& dweight) override;
  void release() override;

  int64_t num_experts() const { return num_experts_; }
  int64_t num_local_experts() const { return local_experts_; }
  int64_t first_local_expert() const { return first_expert_; }
  // Rows each expert received in the last forward, summed over all ranks (E entries; metrics).
  const std::vector<int64_t>& expert_counts() const override { return counts_; }
  // Rows this rank received in the last forward (R): what its dispatch buffers were sized by.
  int64_t received_rows() const { return received_rows_; }
  // Rows this rank sent in the last forward (N*k, itself included).
  int64_t sent_rows() const { return tokens_ * top_k_; }

 private:
  // all_to_all_v of rows with `width` elements each: `send_rows[p]` rows to peer p from
  // consecutive blocks of `send`, `recv_rows[p]` from peer p into consecutive blocks of `recv`.
  void exchange_rows(const Tensor& send, const std::vector<int64_t>& send_rows, const Tensor& recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);

  Backend& backend_;
  Stream& stream_;
  Comm& comm_;
  DType dtype_;
  ops::SwigluParams activation_;
  int64_t num_experts_, local_experts_, first_expert_;
  int64_t tokens_ = 0, top_k_ = 0, received_rows_ = 0;
  bool have_forward_ = false;
  std::vector<int64_t> counts_;          // (E) global rows per expert
  std::vector<int64_t> send_rows_;       // (W) rows sent to each rank
  std::vector<int64_t> recv_rows_;       // (W) rows received from each rank
  std::vector<int64_t> expert_offsets_;  // (E/W + 1) local experts' row ranges, grouped order
  // Source side: the send permutation (M) and the expert outputs brought back (M, H), which
  // backward's row-weight gradient needs and which then holds dy in place.
  OwnedTensor send_token_, send_slot_, send_weight_, y_back_;
  // Owner side: arrival row of each grouped row and its inverse (R); the grouped inputs and the
  // SwiGLU pre-activations (R, H), (R, F), (R, F).
  OwnedTensor perm_, inv_perm_, x_rows_, a_, b_;
};

}  // namespace moepeak::schedules
