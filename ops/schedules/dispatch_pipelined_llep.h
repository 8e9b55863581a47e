// PipelinedLlepDispatch: receiver-bounded expert dispatch (docs/design.md#the-schedules, paper eq.
// 1). LLEP (llep_plan.h) per chunk of tokens, with every dispatch buffer allocated at a size fixed
// by (N, k, W, c, K_max, alpha, lambda) before the router has said anything: skew lengthens nothing
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
// whatever the routing) -> dispatch (rows in LlepRoute's send order through one (M_c, H) send
// staging buffer, one all_to_all_v, into a receive slot (R_c, H)) -> the expert MLP per tile of
// at most T rows of one expert (the tile's rows gathered from the slot into a (T, H) tile buffer,
// or read in place when they are one run of arrival rows), blocked over F: for each block fb of
// at most F_b of the F columns, a = x w1[fb]^T, b = x w3[fb]^T, g = silu(a) * b (T, F_b) and
// y += g w2[:, fb]^T into a (T, H) tile, written back into the slot at the arrival rows the tile
// came from -> the slot, now holding the rows to return in arrival order, back to the sources
// (all_to_all_v) -> combine in expert order. Experts with biases (gpt-oss) add b1[fb], b3[fb]
// to a and b per block and b2 to the y tile once per row, and g is the dispatcher's activation
// (gpt-oss's clamped SwiGLU, or the plain one): llep_tile_mlp.h, with backward's bias terms.
//
// Slots and overlap: three streams, each with its own communicator — the dispatch lane (chunk
// i+1's rows out), `stream` (chunk i's experts) and the return lane (chunk i-1's results back
// and combined into `out`) — and S receive slots in flight, chosen at launch by
// pipelined_llep_shape (below; schedules.llep_slots asks for one). Slot i%S is refilled only
// after chunk i-S has returned and been combined, so S = 3 keeps all three stages busy at once;
// S = 2 runs chunk i-1's return, then chunk i+1's dispatch, both beside chunk i's experts; S = 1
// runs the three one after another (no overlap) and returns into the send staging buffer (with
// S >= 2 the returned rows land in a buffer of their own). The spilled experts' weights travel
// on the return lane before chunk 0's return, beside chunk 0's dispatch.
//
// Backward recomputes each chunk's experts (nothing routing-sized is kept from forward: the
// dispatch live set is empty between forward and backward): the source sends x rows, then dout
// rows, through the one staging buffer (two exchanges on the comm stream) into the slot's x and
// dout buffers, and its routing weights; the compute rank runs, per tile and F block, with
// w = the rows' routing weights: a, b, g recomputed; dweight += g . (dout w2[:, fb]) per row
// (dout . y summed over the blocks, so y is never formed); dg = w * (dout w2[:, fb]);
// dw2[:, fb] += dout^T (w * g); da, db from the SwiGLU backward; dw1[fb] += da^T x,
// dw3[fb] += db^T x; dx += da w1[fb] + db w3[fb] into a (T, H) tile (with biases: db1[fb],
// db3[fb] += da's, db's column sums per block; dweight += dout . b2 and db2 += dout^T w once per
// tile) — then writes dx over the slot's dout rows and dweight over its weights, and returns
// both; helpers accumulate spilled experts' weight gradients over the chunks and return them to
// their owners after the last one (+=). That is 8 GEMMs per tile and block where a forward and a
// backward of y take 9.
//
// Weight spilling, once per pass: the weights of every expert some chunk's plan spills to a
// helper are sent owner -> helper before chunk 0 (llep_experts.h), not again per chunk, on the
// return lane while chunk 0 is dispatched.
//
// Host synchronisations: two per forward, none in backward — the routing to the host (the
// plans are made there) and one all-gather of every rank's token count and per-chunk expert
// counts (a second only when ranks hold different N); every other ordering is an event wait.
//
// Bound (docs/memory.md "Dispatch bound"). Every buffer with H or F columns ("rows") counts
// against 2 * Ep * k * c_eff * H * b = 2 * W * M_c * H * b (Ep = W); the per-chunk metadata — i32
// send token / slot indices (M_c), per-row routing weights and their gradients (M_c or R_c), a
// tile's weights and dweights (T) — sits beside it: pipelined_llep_bound_bytes is the sum. In
// units U = M_c * H * b, rho = R_c / M_c (<= max(1, alpha, lambda), 1.3 at the defaults):
//   S >= 2: forward 2 + S rho, backward 2 + 2 S rho    S = 1: forward 1 + rho, backward 1 + 2 rho
// plus the tile temporaries: forward x and y tiles (T, H) and a, b, g (T, F_b); backward x, dout
// and dx tiles (T, H) and a, b, g, dg (T, F_b). The rule (pipelined_llep_shape), with
// T_min = min(c_eff, max(1, min_tokens_per_gemm)), F_min = min(F, 64) and every size an arena
// footprint:
//   S = 2 if the two-slot rows with T_min-row tiles and F_min-column blocks fit under 2 W U
//     (forward and backward), else S = 1 if T = 1, F_b = 1 fits; schedules.llep_slots = S
//     instead takes that S, bounded if it fits so (S = 1: with T = 1, F_b = 1);
//   then (T, F_b): a GEMM's per-call packing of the weight block and of the tile's rows costs
//     about 1/T + 1/F_b per flop, so among T <= c_eff (>= T_min when S >= 2) with the widest
//     F_b >= F_min (>= 1 if F_min does not fit even at T = 1) that fits beside it, the pair
//     with the smallest 1/T + 1/F_b; F is then cut into ffn_blocks = ceil(F / F_b) equal blocks;
//   else (max(alpha, lambda) near W, e.g. W = 2 with lambda >= 1.5; W = 1, where R_c = M_c and
//     backward needs 3 U; or rows so narrow that footprint rounding dominates; or more slots
//     asked for than fit) S = 1 (or the S asked for) and `bounded` = false: nothing fails, and
//     the peak exceeds the bound by exactly backward's rows minus 2 W U
//     = s fp(M_c H b) + 2 S fp(R_c H b) + 3 fp(T H b) + 4 fp(T F_b b) - 2 W M_c H b
//     (s = 1 for S = 1, else 2). (T, F_b) is then the cheapest pair (as above, T >= T_min,
//     F_b >= F_min) whose rows stay within one U of the least overshoot, that of T_min-row tiles
//     and F_min-column blocks: tiles that small cost a GPU one launch per 32 x 64 block.
// Backward's rows and metadata are never below forward's, so the peak is backward's and the
// metadata term of the bound is backward's.
// At the defaults (alpha = 1, lambda = 1.3): S = 1 at W = 2 and 3; S = 2 at W >= 4 once the
// 0.8 U that W = 4 leaves holds T_min-row tiles, 0.8 M_c H >= T_min (3 H + 4 F_min) (M_c >= 160
// at H = 256 with T_min = 32, F >= 64). pipelined_llep_dispatch_bytes is the exact sum of what
// the dispatcher allocates; the measured peak equals it whatever the router does. The experts'
// biases and activation add no buffer (the bias terms are broadcasts into the a, b and y blocks
// and one-column GEMMs), so the byte functions do not depend on them.
// Spilled experts' weight copies are `weights`/`grads` (llep_experts.h; with biases each copy
// holds 2 F + H more elements: llep_expert_elements).
//
// Exactness against ExpertParallelDispatch: the same function in another order of summation,
// so the results agree within a float tolerance, not bitwise: y and dx are sums over F blocks
// (the standard sums over F in one GEMM), dweight is g . (dout w2) summed over F where the
// standard sums dout . y over H, OpenBLAS rounds a GEMM row differently depending on where it
// falls in the register blocking of per-chunk tiles, and expert weight gradients are summed per
// chunk, per tile and per helper in another order. Each token still adds its k outputs (and dx
// rows) in the same expert order. With bf16 storage every such sum runs in fp32 (the tile
// accumulators above, the fp32 expert gradients of schedules::main_grad_dtype), so a bf16 result
// differs from the standard schedule's by the rounding of the result, not by one per F block or
// chunk. With biases likewise: y starts from b2 and adds the blocks one by one (the standard adds
// b2 to one GEMM's sum), dweight adds dout . b2 after the blocks, db2 sums weight * dout over a
// tile's rows in a one-column GEMM (the standard: column sums of the rounded dy), db1 and db3 sum
// per block, chunk and tile.
// tests/parallel/test_llep.cpp and test_llep_gpt_oss.cpp state the tolerances and what was
// measured.
//
// Lifetimes: x, index and weight passed to forward() must stay alive and unchanged until
// backward() or release() (backward recomputes from them; the model keeps them in its layer
// activations). Collective: the constructor (when it makes its own lane: comm.duplicate()),
// forward() and backward() are called by every rank in the same order.
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
#include "ops/swiglu.h"

namespace moepeak::schedules {

// The most receive slots a pipeline keeps in flight (schedules.llep_slots).
inline constexpr int64_t kPipelinedLlepMaxSlots = 3;

// The [schedules] keys the dispatcher reads: chunk_tokens, max_chunks, chunk_membership,
// llep_lambda, llep_alpha, min_tokens_per_gemm, llep_slots, llep_max_helped_experts
// (pipelined_llep_params below).
struct PipelinedLlepParams {
  int64_t chunk_tokens = 4096;  // c: the per-source token budget of a chunk
  int64_t max_chunks = 16;      // K_max
  ChunkMembership membership = ChunkMembership::strided;
  double lambda = 1.3;
  double alpha = 1.0;
  int64_t min_tokens_per_gemm = 32;
  int64_t slots = 0;               // S in [1, kPipelinedLlepMaxSlots]; 0 = the rule (see "Bound")
  int64_t max_helped_experts = 0;  // new foreign experts per rank per chunk plan (LlepParams)

  LlepParams llep() const { return {alpha, lambda, min_tokens_per_gemm, max_helped_experts}; }
};

// The [schedules] section's dispatch knobs as PipelinedLlepParams.
PipelinedLlepParams pipelined_llep_params(const SchedulesConfig& schedules);

// The launch-time shape of the pipeline for N_max tokens per rank.
struct PipelinedLlepShape {
  int64_t chunks = 0;           // K = min(ceil(N_max / c), K_max)  (0 when N_max == 0)
  int64_t chunk_tokens = 0;     // c_eff = ceil(N_max / K)
  int64_t rows_per_source = 0;  // M_c = k * c_eff
  int64_t receive_rows = 0;     // R_c = llep_receive_capacity(M_c, W, params)
  // Set by the overload with H, F and the dtype only (0 / true otherwise): see "Bound" above.
  int64_t slots = 0;       // S: receive slots in flight, 1 to kPipelinedLlepMaxSlots
  int64_t tile_rows = 0;   // T: rows per expert tile, 1 <= T <= c_eff
  int64_t ffn_blocks = 0;  // the expert MLP runs over its F columns in this many blocks,
  int64_t ffn_block = 0;   // F_b = ceil(F / ffn_blocks) columns each (the last may be narrower)
  bool bounded = true;     // the rows fit 2 * W * M_c * H * b (false only in the corner case)
};
// The chunking only (K, c_eff, M_c, R_c; slots and tile_rows 0).
PipelinedLlepShape pipelined_llep_shape(int64_t tokens, int64_t top_k, int64_t world,
                                        const PipelinedLlepParams& params);
// The whole shape, S and T included: what the dispatcher runs and the byte functions count.
PipelinedLlepShape pipelined_llep_shape(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                        DType dtype, int64_t world,
                                        const PipelinedLlepParams& params);

// Exact peak bytes of the `dispatch` live set (arena footprints fp), the larger of
//   forward:  rows:     send staging (M_c, H) [+ returned rows (M_c, H) if S = 2]
//                       + S receive slots (R_c, H) + x, y tiles (T, H) + a, b, g (T, F_b)
//             metadata: S x (send token, slot i32 (M_c) + routing weight (M_c))
//   backward: rows:     send staging (M_c, H) [+ returned dx (M_c, H) if S = 2]
//                       + S x receive slots of x and dout (R_c, H) + x, dout, dx tiles (T, H)
//                       + a, b, g, dg (T, F_b)
//             metadata: weight staging (M_c) [+ returned dweight (M_c) if S = 2]
//                       + S x (send token, slot i32 (M_c) + received weights / dweights (R_c))
//                       + tile weights and dweights (T)
// in the storage dtype, except the tile accumulators — the y tile, the dx tile and the tile
// dweights, each a sum over F blocks — in main_grad_dtype (fp32 beside bf16: each is rounded to
// bf16 once, into the slot), with the shape of pipelined_llep_shape(tokens, top_k, hidden, ffn,
// dtype, world, params). The dispatcher allocates exactly these at the start of forward and
// backward and frees them at the end.
uint64_t pipelined_llep_dispatch_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params);
// The two parts of it.
uint64_t pipelined_llep_forward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                      DType dtype, int64_t world,
                                      const PipelinedLlepParams& params);
uint64_t pipelined_llep_backward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params);
// The paper's bound plus the metadata: 2 * W * M_c * H * b + the larger of forward's and
// backward's metadata footprints (above). pipelined_llep_dispatch_bytes <= it whenever
// shape.bounded (0 when N_max == 0).
uint64_t pipelined_llep_bound_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                    DType dtype, int64_t world, const PipelinedLlepParams& params);

// The side lanes the overlapped traffic runs on: for dispatch and for return, each a duplicate of
// the compute stream's communicator and the stream it is used on. make() is collective (it
// duplicates `comm` twice).
// NOTES: one lane serves every layer's dispatcher. The layers run one after another from one host
// thread, so their lane traffic is issued in the same order on every rank, and each forward or
// backward's first lane work waits for `entry_` on the compute stream (all of the previous
// layer's compute-stream collectives): the per-layer global orders of the header's NOTES simply
// follow one another. A lane per layer would build one NCCL communicator (with its own buffers,
// outside the arena) and one stream per layer.
struct PipelinedLlepLane {
  static std::shared_ptr<PipelinedLlepLane> make(Backend& backend, Comm& comm);
  std::unique_ptr<Comm> comm;  // dispatch: chunks' rows out to the compute ranks
  std::unique_ptr<Stream> stream;
  // Return: chunks' results back and combined; the spilled experts' weights before chunk 0.
  std::unique_ptr<Comm> return_comm;
  std::unique_ptr<Stream> return_stream;
};

class PipelinedLlepDispatch final : public ExpertDispatch {
 public:
  // num_experts is E, the global count; E % W must be 0 (an Error naming E and W otherwise).
  // The overlapping traffic runs on `lane`, made from `comm`, or when null on a lane of its own
  // (collective: PipelinedLlepLane::make). `activation`: the experts' SwiGLU (default: the plain
  // one).
  PipelinedLlepDispatch(Backend& backend, Stream& stream, Comm& comm, DType dtype,
                        int64_t num_experts, const PipelinedLlepParams& params = {},
                        std::shared_ptr<PipelinedLlepLane> lane = nullptr,
                        const ops::SwigluParams& activation = {});
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
  bool supports_plan_only() const override { return true; }
  // Rows each expert received in the last forward, summed over chunks and ranks (E entries).
  const std::vector<int64_t>& expert_counts() const override { return counts_; }

  int64_t num_local_experts() const { return local_experts_; }
  // The last forward's shape, and its per-chunk plans (the same on every rank).
  const PipelinedLlepShape& shape() const { return shape_; }
  const std::vector<LlepPlan>& plans() const { return plans_; }
  // The most rows this rank computed in one chunk of the last forward (<= shape().receive_rows).
  int64_t max_received_rows() const { return max_received_; }
  // The streams the next chunk's dispatch and the last chunk's return run on (tests slow them
  // with set_debug_delay).
  Stream& comm_stream() { return *lane_->stream; }
  Stream& return_stream() { return *lane_->return_stream; }

 private:
  // One chunk's host metadata: its local token positions, its row layout, and the tiles of the
  // rows this rank computes: each tile one expert's rows, at most T, as `pieces` — runs of
  // arrival rows, in expert-grouped order (expert, then source, then the source's order).
  struct Piece {
    int64_t begin = 0, rows = 0;  // arrival rows [begin, begin + rows)
  };
  struct Tile {
    int64_t expert = 0, rows = 0;
    size_t first = 0, count = 0;  // pieces [first, first + count)
  };
  struct Chunk {
    std::vector<int64_t> tokens;
    LlepRoute route;
    std::vector<Piece> pieces;
    std::vector<Tile> tiles;
  };
  void prepare(const Tensor& x, const Tensor& index, const Tensor& weight);
  // A chunk's send indices to their device slots, on `stream`.
  void copy_metadata(const Chunk& c, const OwnedTensor& token, const OwnedTensor& slot,
                     Stream& stream);
  // The rows of tile t between `arrival` (the slot's rows, arrival order) and `tile` (t.rows
  // rows, tile order), on stream_: into the tile when `gather`, back to the slot otherwise.
  void move_tile_rows(const Chunk& c, const Tile& t, const Tensor& arrival, const Tensor& tile,
                      bool gather);
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
  ops::SwigluParams activation_;
  int64_t num_experts_, local_experts_, first_expert_;
  // The comm stream (dispatch of the next chunk) and its communicator; maybe shared with other
  // layers' dispatchers.
  std::shared_ptr<PipelinedLlepLane> lane_;
  std::unique_ptr<Event> entry_, copies_ready_;
  // Per slot: its rows received (dispatch lane), its results written (compute), its rows back
  // and combined (return lane).
  std::unique_ptr<Event> recv_ready_[kPipelinedLlepMaxSlots], computed_[kPipelinedLlepMaxSlots],
      slot_free_[kPipelinedLlepMaxSlots];
  LlepExpertCopies copies_;

  // What forward keeps for backward: the caller's tensors (views) and host metadata only.
  bool have_forward_ = false;
  Tensor x_, index_, weight_;
  int64_t tokens_ = 0, top_k_ = 0, hidden_ = 0, ffn_ = 0;
  PipelinedLlepShape shape_;
  std::vector<int64_t> counts_;
  std::vector<LlepPlan> plans_;
  // The chunks' host metadata, read by host-to-device copies queued on the dispatch lane: a pass
  // that is over hands it to retired_ with an event after its last use, freed once that passed.
  std::shared_ptr<std::vector<Chunk>> chunks_;
  struct Retired {
    std::shared_ptr<std::vector<Chunk>> chunks;
    std::unique_ptr<Event> done;
  };
  std::vector<Retired> retired_;
  void retire_metadata();
  std::vector<LlepTransfer> transfers_;  // over all chunks (see the NOTES in the .cpp)
  int64_t max_received_ = 0;
};

}  // namespace moepeak::schedules
