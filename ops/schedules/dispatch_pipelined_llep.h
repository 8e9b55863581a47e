// PipelinedLlepDispatch: receiver-bounded expert dispatch (DESIGN.md §7, paper eq. 1). LLEP
// (llep_plan.h) per chunk of tokens, with every dispatch buffer allocated at a size fixed by
// (N, k, W, c, K_max, alpha, lambda) before the router has said anything: skew lengthens nothing
// and grows nothing — it only moves rows between ranks inside the same buffers.
//
//   x       (N, H)   this rank's tokens (N may differ per rank; N_max is the largest)
//   index   (N, k)   i32 top-k GLOBAL expert ids in [0, E), weight (N, k) their weights
//   local_experts    E/W ExpertWeights, this rank's experts in order, with their gradients
//   out     (N, H)   += sum_j weight[n, j] * expert_{index[n, j]}(x[n])
//
// Chunks: K = min(ceil(N_max / c), K_max), c_eff = ceil(N_max / K). Chunk i holds this rank's
// positions i, i + K, i + 2K, ... (strided, the default) or [i * c_eff, (i + 1) * c_eff)
// (contiguous), so every source puts at most c_eff tokens, M_c = k * c_eff rows, in a chunk.
// Per chunk: LLEP plan over the chunk's all-gathered counts with the hard receive capacity
// R_c = llep_receive_capacity(M_c, W, params) (so no rank computes more than R_c rows of a chunk
// whatever the routing) -> dispatch (rows in LlepRoute's send order, one all_to_all_v) ->
// the received rows grouped by expert (a permutation into one more buffer) and the expert GEMMs
// run in tiles of at most c_eff rows -> the outputs back to arrival order and to their sources
// (all_to_all_v) -> combine in expert order.
//
// Overlap: chunk i+1's dispatch runs on this dispatcher's own comm stream with a duplicated
// communicator while chunk i's experts run on `stream`; two receive slots alternate, guarded by
// events (slot i%2 is refilled only after chunk i-2 has returned its rows).
//
// Backward recomputes each chunk's experts (nothing routing-sized is kept from forward: the
// dispatch live set is empty between forward and backward): the source sends x rows, its dout
// rows and the routing weights; the compute rank recomputes y, forms dweight = dout . y and
// dy = weight * dout per row, runs the expert backward and returns dx rows and dweight; helpers
// accumulate spilled experts' weight gradients over the chunks and return them to their owners
// after the last one (+=).
//
// Weight spilling, once per pass: the weights of every expert some chunk's plan spills to a
// helper are sent owner -> helper before chunk 0 (llep_experts.h), not again per chunk.
//
// Bound (pipelined_llep_dispatch_bytes; docs/memory.md "Dispatch bound"): the receive rows of
// the two chunks in flight are 2 * R_c * H * b <= 2 * Ep * k * c_eff * H * b (Ep = W, since
// R_c <= W * M_c); with LLEP's cap R_c = max(ceil(alpha M_c), floor(lambda M_c), M_c), i.e.
// 1.3 * k * c_eff at the defaults. Besides those, the live set holds the computing chunk's rows
// grouped by expert (R_c), fixed send staging (M_c rows), in backward the dout rows beside the
// x rows (received and grouped), c_eff-row expert temporaries and the per-chunk metadata; the
// function is their exact sum, and the measured peak equals it whatever the router does.
// Spilled experts' weight copies are `weights`/`grads` (llep_experts.h).
//
// Exactness against ExpertParallelDispatch: every row goes through the same expert arithmetic
// and each token adds its k outputs (and dx rows) in the same expert order, so the results agree
// to within an ulp or so per row, not bitwise: OpenBLAS rounds a GEMM row differently depending
// on where it falls in the GEMM's register blocking, and the pipeline runs each expert over
// per-chunk tiles of other sizes than the standard's one GEMM per expert. Expert weight
// gradients are summed per chunk, per tile and per helper in another order (fp tolerance).
// tests/parallel/test_llep.cpp states the tolerances and what was measured.
//
// Lifetimes: x, index and weight passed to forward() must stay alive and unchanged until
// backward() or release() (backward recomputes from them; the model keeps them in its layer
// activations). Collective: the constructor (comm.duplicate()), forward() and backward() are
// called by every rank in the same order.
//
// Test: ctest -R test_llep (tests/parallel/test_llep.cpp, 2 and 4 ranks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/llep_plan.h"
#include "ops/schedules/llep_route.h"

namespace moepeak::schedules {

// The [schedules] keys the dispatcher reads: chunk_tokens, max_chunks, chunk_membership,
// llep_lambda, llep_alpha, min_tokens_per_gemm (pipelined_llep_params below).
struct PipelinedLlepParams {
  int64_t chunk_tokens = 4096;  // c: the per-source token budget of a chunk
  int64_t max_chunks = 16;      // K_max
  ChunkMembership membership = ChunkMembership::strided;
  double lambda = 1.3;
  double alpha = 1.0;
  int64_t min_tokens_per_gemm = 32;

  LlepParams llep() const { return {alpha, lambda, min_tokens_per_gemm}; }
};

// The [schedules] section's dispatch knobs as PipelinedLlepParams.
PipelinedLlepParams pipelined_llep_params(const SchedulesConfig& schedules);

// The launch-time shape of the pipeline for N_max tokens per rank.
struct PipelinedLlepShape {
  int64_t chunks = 0;           // K = min(ceil(N_max / c), K_max)  (0 when N_max == 0)
  int64_t chunk_tokens = 0;     // c_eff = ceil(N_max / K)
  int64_t rows_per_source = 0;  // M_c = k * c_eff
  int64_t receive_rows = 0;     // R_c = llep_receive_capacity(M_c, W, params)
};
PipelinedLlepShape pipelined_llep_shape(int64_t tokens, int64_t top_k, int64_t world,
                                        const PipelinedLlepParams& params);

// Exact peak bytes of the `dispatch` live set (arena footprints), the larger of
//   forward:  send staging x (M_c, H) + returned rows (M_c, H) + 2 metadata slots (token, slot
//             i32 and weight, M_c each; grouping permutation and inverse, i32 R_c each) + 2
//             receive slots (R_c, H) + the grouped rows (R_c, H) + a, b, g (c_eff, F)
//   backward: send staging (M_c, H) + weight staging (M_c) + returned dx (M_c, H) and dweight
//             (M_c) + 2 metadata slots (token, slot i32, M_c each; permutation and inverse, R_c
//             each) + 2 receive slots of x and dout (R_c, H) and weight and dweight (R_c) + the
//             same four grouped + y/dy (c_eff, H) + a, b, g, dg (c_eff, F) + an i32 row index
//             (c_eff)
// with the shape of pipelined_llep_shape(tokens, top_k, world, params). The dispatcher
// allocates exactly these at the start of forward and backward and frees them at the end.
uint64_t pipelined_llep_dispatch_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params);
// The two parts of it.
uint64_t pipelined_llep_forward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                      DType dtype, int64_t world, const PipelinedLlepParams& params);
uint64_t pipelined_llep_backward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params);

class PipelinedLlepDispatch final : public ExpertDispatch {
 public:
  // num_experts is E, the global count; E % W must be 0 (an Error naming E and W otherwise).
  // Duplicates `comm` (collective) for the overlapping traffic and creates a comm stream.
  PipelinedLlepDispatch(Backend& backend, Stream& stream, Comm& comm, DType dtype,
                        int64_t num_experts, const PipelinedLlepParams& params = {});
  ~PipelinedLlepDispatch() override;
  PipelinedLlepDispatch(const PipelinedLlepDispatch&) = delete;
  PipelinedLlepDispatch& operator=(const PipelinedLlepDispatch&) = delete;

  // Forward: out += MoE(x). With an undefined `out` (Tensor()) it only plans — the counts
  // exchange and the chunk plans, no dispatch and no expert GEMMs — which is all backward needs:
  // under the layer's checkpoint the recompute before backward can pass Tensor() and save a
  // whole dispatch and expert forward (backward recomputes the experts chunk by chunk anyway).
  void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
               const std::vector<ExpertWeights>& local_experts, const Tensor& out) override;
  void backward(const Tensor& dout, const std::vector<ExpertWeights>& local_experts,
                const Tensor& dx, const Tensor& dweight) override;
  void release() override;
  // Rows each expert received in the last forward, summed over chunks and ranks (E entries).
  const std::vector<int64_t>& expert_counts() const override { return counts_; }

  int64_t num_local_experts() const { return local_experts_; }
  // The last forward's shape, and its per-chunk plans (the same on every rank).
  const PipelinedLlepShape& shape() const { return shape_; }
  const std::vector<LlepPlan>& plans() const { return plans_; }
  // The most rows this rank computed in one chunk of the last forward (<= shape().receive_rows).
  int64_t max_received_rows() const { return max_received_; }
  // The stream the next chunk's dispatch runs on (tests slow it with set_debug_delay).
  Stream& comm_stream() { return *comm_stream_; }

 private:
  // One chunk's host metadata: its local token positions, its row layout, and the grouping of
  // the rows this rank computes by expert (`groups` in the grouped order; perm/inv map grouped
  // rows to arrival rows and back).
  struct Group {
    int64_t expert = 0, begin = 0, rows = 0;
  };
  struct Chunk {
    std::vector<int64_t> tokens;
    LlepRoute route;
    std::vector<int32_t> perm, inv;
    std::vector<Group> groups;
  };
  void prepare(const Tensor& x, const Tensor& index, const Tensor& weight);
  // A chunk's send indices and grouping permutations to their device slots, on `stream`.
  void copy_metadata(const Chunk& c, const OwnedTensor& token, const OwnedTensor& slot,
                     const OwnedTensor& perm, const OwnedTensor& inv, Stream& stream);
  // fn(expert, begin, end) for the grouped rows of each expert in tiles of at most `tile` rows.
  template <typename Fn> static void for_each_tile(const Chunk& c, int64_t tile, Fn&& fn) {
    for (const Group& g : c.groups) {
      for (int64_t lo = g.begin; lo < g.begin + g.rows; lo += tile) {
        fn(g.expert, lo, std::min(lo + tile, g.begin + g.rows));
      }
    }
  }
  void run_forward(const std::vector<ExpertWeights>& local_experts, const Tensor& out);
  void run_backward(const Tensor& dout, const std::vector<ExpertWeights>& local_experts,
                    const Tensor& dx, const Tensor& dweight);
  void exchange_rows(Comm& comm, Stream& stream, const Tensor& send,
                     const std::vector<int64_t>& send_rows, const Tensor& recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);
  // llep_max_copies for this pass: K plans, each of hard capacity max(1, R_c).
  int64_t max_copies() const;
  const ExpertWeights& weights_of(int64_t expert, const std::vector<ExpertWeights>& local,
                                  const LlepExpertCopies& copies) const;
  OwnedTensor buffer(Shape shape, DType dtype, const char* what);
  void drain() noexcept;

  Backend& backend_;
  Stream& stream_;
  Comm& comm_;
  DType dtype_;
  PipelinedLlepParams params_;
  int64_t num_experts_, local_experts_, first_expert_;
  std::unique_ptr<Comm> comm2_;           // the comm stream's communicator
  std::unique_ptr<Stream> comm_stream_;   // dispatch of the next chunk
  std::unique_ptr<Event> entry_, recv_ready_[2], slot_free_[2];
  LlepExpertCopies copies_;

  // What forward keeps for backward: the caller's tensors (views) and host metadata only.
  bool have_forward_ = false;
  Tensor x_, index_, weight_;
  int64_t tokens_ = 0, top_k_ = 0, hidden_ = 0, ffn_ = 0;
  PipelinedLlepShape shape_;
  std::vector<int64_t> counts_;
  std::vector<LlepPlan> plans_;
  std::vector<Chunk> chunks_;
  std::vector<LlepTransfer> transfers_;  // over all chunks (see the NOTES in the .cpp)
  int64_t max_received_ = 0;
};

}  // namespace moepeak::schedules
