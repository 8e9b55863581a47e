// Ring-DTP (docs/design.md#the-schedules, paper eq. 2-3): the exact vocabulary projection and
// cross-entropy over distinct batches, without ever forming the (N, V) logits. The bounded
// counterpart of MaterializedVocab (vocab_materialized.h), held to it by
// tests/parallel/test_ring_dtp.cpp.
//
// Layout over the P = W ranks of `comm`:
//   x        (N, H)    this rank's own batch (final-norm hidden states); N the same on every rank
//   labels   (N)       i64 global vocabulary ids of those tokens, -100 = not scored
//   lm_head  (V_r, H)  this rank's rows [begin, end) = vocab_shard(V, P, r) of the (V, H) LM head
//                      (the tensor ZeroParamStore keeps under LmHeadSharding::vocab_rows:
//                      lm_head_rows(V, W, r) is the same interval); its gradient likewise
//
// Forward: over P rounds every batch X_j meets every shard W_s once. Each round forms the logits
// X_j W_s^T strip by strip — (N, c) with c = vocab_strip columns, the whole shard when 0 — and
// folds each strip into the per-token state (max m, sum of exponentials z, target logit t;
// ops/cross_entropy_strip.h) before the next strip overwrites it. The loss of token n is
// m + log z - t; forward returns loss_scale * the sum over this rank's scored tokens (this
// rank's share; the caller all-reduces, as with MaterializedVocab).
// Backward: a second ring re-forms the strips, turns each into its gradient in place,
// G = scale * (exp(y - lse) - onehot), and accumulates dX_j += G W_s and dW_s += G^T X_j.
// Kept strips (`kept` > 0, schedules.vocab_kept_strips): the first `kept` strips a rank forms —
// in round order, strip order within a round — are formed in forward into a buffer that stays
// until backward, which turns them into their gradients in place instead of re-forming them.
// Each kept strip saves one of backward's strip GEMMs (P = 1 runs 3 + (S - kept)/S strip GEMMs
// per column instead of 4, S strips in all) and holds N c b bytes from forward to backward. The
// results are the same bits: a strip is formed by the same GEMM either way, and every sum runs
// in the same order.
//
// What travels (ring direction: rank r sends to r+1 and receives from r-1; in round k rank r
// holds the batch or shard of rank (r - k) mod P):
//   weights      the shard W_s travels, each batch stays home. Forward: the state stays home
//                too, so there is no return hop. Backward: dW_s travels with W_s (starting as
//                the owner's own dlm_head, += its round-0 share) and takes one more hop back to
//                its owner, landing in dlm_head; dX accumulates at home.
//   activations  X_j (and its labels) travel, each shard stays home. Forward: the batch's state
//                follows one round behind (each round folds into a fresh partial state that is
//                merged into the arriving one) and takes a last hop home. Backward: X_j, its
//                labels and its final state travel with the batch's dX accumulator (starting as
//                the caller's dx, = in round 0), which takes a last hop home into dx; dW_s
//                accumulates at home in dlm_head.
//   auto         weights when N > V/P (then a shard is smaller than a batch: N*P > V).
// Traffic runs on a second stream with a duplicate() communicator, overlapped with the strip
// GEMMs: the next round's payload moves while this round computes; a travelling accumulator is
// sent as soon as its last GEMM of the round is done, while the home GEMM still runs.
//
// Memory (the `logits` live set holds everything this schedule allocates: strips, states and the
// payload buffers; nothing goes to another set): exactly ring_dtp_bytes(), see docs/memory.md.
// Between forward and backward only the (N, 3) f64 home state stays (N*24 bytes).
//
// Collective: every rank constructs it (duplicate() is collective) and calls forward() and
// backward() in the same order with the same N, H, V. The streams: the caller's `stream` computes;
// the schedule's own comm stream moves data, ordered after the caller's prior work on `stream`
// when a call starts; forward() and backward() synchronise both streams before they return.
//
// Test: ctest -R ring_dtp --output-on-failure
#pragma once

#include <cstdint>
#include <memory>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/vocab.h"

namespace moepeak::schedules {

// Rank r's contiguous vocabulary interval [begin, end) out of V over P ranks:
// begin = floor(r V / P), so shards hold floor(V/P) or ceil(V/P) rows. Requires V >= P.
struct VocabInterval {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
VocabInterval vocab_shard(int64_t vocab, int ranks, int rank);
// The largest shard: ceil(V / P).
int64_t vocab_shard_max(int64_t vocab, int ranks);
// Columns of one strip: the whole (largest) shard when strip == 0, else min(strip, ceil(V/P)).
int64_t ring_dtp_strip_columns(int64_t vocab, int ranks, int64_t strip);
// The payload a setting means for N tokens per rank: `automatic` is weights when N * P > V,
// else activations. Never returns automatic.
VocabPayload ring_dtp_resolve_payload(VocabPayload payload, int64_t tokens, int64_t vocab,
                                      int ranks);

// The strips one rank forms in one pass (forward or backward), fewest and most over the ranks:
// with weights travelling every rank forms sum_s ceil(|V_s| / c); with activations travelling
// rank r forms P ceil(|V_r| / c), so uneven shards give the ranks different counts.
struct RingDtpStripCount {
  int64_t fewest = 0, most = 0;
};
RingDtpStripCount ring_dtp_strip_count(int64_t vocab, int ranks, int64_t strip,
                                       VocabPayload resolved_payload);
// The strips kept from forward to backward on every rank: min(kept, fewest). The same on every
// rank, so the bound below holds on each one exactly.
int64_t ring_dtp_kept_strips(int64_t vocab, int ranks, int64_t strip, int64_t kept,
                             VocabPayload resolved_payload);

// The `logits` live set of Ring-DTP, in arena footprints (DeviceArena::footprint, 256-byte
// blocks). fp() = footprint, b = dtype bytes, b_g = main_grad_dtype's (4 for bf16: the dW and dX
// accumulators sum over strips and rounds in fp32, and travel in fp32), c =
// ring_dtp_strip_columns, Vm = ceil(V/P),
// h = min(P - 1, 2) receive buffers per travelling tensor (double-buffered; one for P = 2, none
// for P = 1), K = ring_dtp_kept_strips:
//   kept   = fp(K N c b)   the kept strips, from forward to backward (0 when K = 0)
//   strip  = fp(N c b)     the one strip in flight (reused strip after strip); not allocated
//                          when K covers the most strips any rank forms (`work` = 0, else 1)
//   state  = fp(N 3 8)     (m, z, t) per token, f64
//   batch  = fp(N H b) + fp(N 8) + state      a travelling batch: X, its labels, a state
//   weights      forward  = state + kept + work strip + h fp(Vm H b)              (+ W)
//                backward = state + kept + work strip + h fp(Vm H b) + h fp(Vm H b_g)
//                           + home                                    (+ W, dW, dX home)
//   activations  forward  = state + kept + work strip + h batch + [P > 1] state
//                                                  (+ X, labels, arriving state; partial state)
//                backward = state + kept + work strip + h batch + h fp(N H b_g) + home
//                                                  (+ X, labels, final state; dX; dX home)
//   home   = fp(N H b_g) when b_g > b (bf16: the fp32 home dX, rounded into dx once), else 0
// The leading `state` (the home state) and `kept` stay from forward to backward.
struct RingDtpBytes {
  uint64_t strip = 0;       // one strip
  uint64_t state = 0;       // one per-token state
  int64_t kept_strips = 0;  // K
  uint64_t kept = 0;        // the kept strips' buffer
  uint64_t forward = 0;     // the set's peak in forward
  uint64_t saved = 0;       // what stays from forward to backward (home state + kept strips)
  uint64_t backward = 0;    // the set's peak in backward
  uint64_t peak() const { return forward > backward ? forward : backward; }
};
RingDtpBytes ring_dtp_memory(int64_t tokens, int64_t hidden, int64_t vocab, int ranks,
                             int64_t strip, int64_t kept, VocabPayload payload, DType dtype);
// The planner's number: ring_dtp_memory(...).peak().
uint64_t ring_dtp_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int ranks, int64_t strip,
                        int64_t kept, VocabPayload payload, DType dtype);

class RingDtpVocab final : public VocabProjection {
 public:
  // vocab: the global V; payload: auto | activations | weights; strip: columns per strip, 0 =
  // whole shard; kept: strips kept from forward to backward (at most the strips formed).
  // Duplicates `comm` (collective) for the ring's traffic when P > 1.
  RingDtpVocab(Backend& backend, Stream& stream, Comm& comm, DType dtype, int64_t vocab,
               VocabPayload payload = VocabPayload::automatic, int64_t strip = 0, int64_t kept = 0);
  ~RingDtpVocab() override;
  RingDtpVocab(const RingDtpVocab&) = delete;
  RingDtpVocab& operator=(const RingDtpVocab&) = delete;

  // This rank's rows of the LM head (and of its gradient).
  VocabInterval shard() const { return shard_; }

  // Returns loss_scale * sum over this rank's scored tokens of (lse - target logit); keeps the
  // (N, 3) home state for backward. Labels must stay alive and unchanged until backward().
  // Throws naming the position and label when a label is neither -100 nor in [0, V).
  double forward(const Tensor& x, const Tensor& lm_head_shard, const Tensor& labels,
                 double loss_scale) override;
  // dx (N, H) =, dlm_head_shard (V_r, H) += (this rank's rows, summed over every rank's batch).
  // dx has x's dtype; dlm_head_shard main_grad_dtype's (fp32 beside bf16).
  // Releases the home state.
  void backward(const Tensor& x, const Tensor& lm_head_shard, const Tensor& dx,
                const Tensor& dlm_head_shard) override;
  // Drops the saved state without a backward (evaluation).
  void release() override;

  // The payload the last forward used (auto resolved for its N).
  VocabPayload payload() const { return resolved_; }
  int64_t strip_columns() const { return strip_columns_; }
  // The strips the last forward kept for backward (ring_dtp_kept_strips for its N).
  int64_t kept_strips() const { return kept_; }
  // The stream the ring's traffic runs on (tests slow it to expose a missing wait).
  Stream& comm_stream() { return *comm_stream_; }

 private:
  struct Problem;  // shapes of one call, checked
  Problem check(const Tensor& x, const Tensor& lm_head_shard, const Tensor& labels) const;
  OwnedTensor alloc(Shape shape, DType dtype, const char* what);
  std::unique_ptr<Event> record(Stream& stream);
  void forward_weights(const Problem& p, const Tensor& x, const Tensor& w, const Tensor& labels,
                       const Tensor& state);
  void forward_activations(const Problem& p, const Tensor& x, const Tensor& w, const Tensor& labels,
                           const Tensor& state);
  void backward_weights(const Problem& p, const Tensor& x, const Tensor& w, const Tensor& dx,
                        const Tensor& dw);
  void backward_activations(const Problem& p, const Tensor& x, const Tensor& w, const Tensor& dx,
                            const Tensor& dw);
  // Waits for both streams (buffers used on two streams are released only after both passed).
  void synchronize_streams();
  // Where strip number `q` of this pass (counted over rounds, from 0) of `columns` columns is
  // formed: its slot of the kept buffer when q < kept_, else the one working strip.
  Tensor strip_at(int64_t q, int64_t columns, const OwnedTensor& working) const;
  // The working strip, when some strip of a pass is not kept on some rank (else empty).
  OwnedTensor alloc_working_strip(const Problem& p);

  Backend& backend_;
  Stream& stream_;
  std::unique_ptr<Comm> comm_;  // the duplicate, used only on comm_stream_ (null for P = 1)
  std::unique_ptr<Stream> comm_stream_;
  DType dtype_;
  int64_t vocab_;
  int ranks_, rank_;
  VocabPayload payload_, resolved_;
  int64_t strip_columns_;
  int64_t kept_requested_;
  VocabInterval shard_;
  // Kept from forward to backward.
  OwnedTensor saved_state_;   // (N, 3) f64
  OwnedTensor saved_strips_;  // (K, N, c): the kept strips' logits (forward), then gradients
  int64_t kept_ = 0;          // K
  Tensor labels_;
  double loss_scale_ = 0;
  int64_t tokens_ = 0, hidden_ = 0;
};

}  // namespace moepeak::schedules
