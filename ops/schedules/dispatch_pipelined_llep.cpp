// PipelinedLlepDispatch: LLEP per chunk, S receive slots in flight (fixed at launch by the byte
// budget or schedules.llep_slots), the next chunk's dispatch on the dispatch lane and the last
// chunk's return and combine on the return lane while this chunk's experts run, experts per
// tile written back into the slot, recomputed in backward (see the header).
//
// Stream discipline (NOTES):
//   - three streams, three communicators: `stream_` (compute) uses comm_ (only for the plan's
//     counts and, in backward, the spilled gradients' return), the dispatch lane `cs` its `cc`,
//     the return lane `rs` its `rc` (both duplicated). Each issues its collectives in chunk
//     order, the same on every rank; chunk i's dispatch X_i waits for R_{i-S} (its slot's
//     return), its experts C_i for X_i (and chunk 0's for the weight copies W on rs), its return
//     R_i for C_i — so the per-stream orders merge into one global order (S = 2: W, X0, X1, R0,
//     X2, R1, ...) in which every collective waits only for earlier ones: no deadlock.
//   - cs and rs start after `entry_` (the caller's work on stream_ that produced x, dout, and
//     the compute stream's waits on the expert weights, e.g. ZeroTraffic's gathers). In forward
//     prepare()'s host synchronisation already orders them; in backward the wait alone does.
//   - slot s (receive rows, send indices, routing weights) is written by cs for chunk i, read by
//     stream_, read again by rs, and refilled by cs only after slot_free_[s], recorded on rs
//     after chunk i's combine. The send staging buffer is cs's alone with S >= 2 (the results
//     return into a buffer of rs's own); with S = 1 they return into it, after computed_ (the
//     sends have left it) and before slot_free_ lets cs refill it.
//   - a tile's rows are read from and written back to the slot on stream_ only; each arrival row
//     belongs to exactly one tile, so a tile's writes never touch another tile's inputs.
//   - `out` (forward) and dx, dweight (backward) are accumulated on rs only, in chunk order, so
//     each token adds its k results in the order the standard dispatcher does.
//   - the host never waits inside the loop or at its end: the compute stream waits for rs's last
//     slot_free_ (every earlier lane work precedes it), so the buffers freed on return go back to
//     the arena behind all their uses, and every lane's next work waits for the compute stream.
//     The chunks' host metadata, read by copies queued on cs, is retired with an event instead of
//     freed (retire_metadata).
//   - weight spilling is done once per pass, not per chunk: every (expert, helper) pair of any
//     chunk's plan gets its copy before chunk 0 (on rs, beside chunk 0's dispatch), helpers
//     accumulate a spilled expert's gradient over all chunks and return it once after the last
//     chunk. Per-chunk transfers would move the same hot experts' 3 F H values up to K times each
//     way; the copies held are at most llep_max_copies(E, W, R_c, K) <= E - E/W foreign experts
//     either way (`weights`, `grads`; checked in LlepExpertCopies::allocate, counted by the plan).
//     With biases a copy carries b1, b3, b2 beside the weights, and their gradients return with
//     the weights' (llep_experts.h).
// The shape and byte functions: dispatch_pipelined_llep_shape.cpp; the blocked expert MLP of a
// tile (biases and activation included): llep_tile_mlp.cpp.
// Test: ctest -R test_llep
#include "ops/schedules/dispatch_pipelined_llep.h"

#include <algorithm>

#include "core/error.h"
#include "core/runtime/stream_profile.h"
#include "ops/convert.h"
#include "ops/fill.h"
#include "ops/permute.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/llep_tile_mlp.h"
#include "ops/schedules/schedule_dtype.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

PipelinedLlepDispatch::PipelinedLlepDispatch(Backend& backend, Stream& stream, Comm& comm,
                                             DType dtype, int64_t num_experts,
                                             const PipelinedLlepParams& params,
                                             std::shared_ptr<PipelinedLlepLane> lane,
                                             const ops::SwigluParams& activation)
    : backend_(backend),
      stream_(stream),
      comm_(comm),
      dtype_(dtype),
      params_(params),
      activation_(activation),
      num_experts_(num_experts) {
  ops::check_swiglu_params("pipelined llep dispatch", activation);
  const int64_t W = comm.world_size();
  MOEPEAK_CHECK(num_experts > 0 && num_experts % W == 0,
                "pipelined llep dispatch: the number of experts E = ", num_experts,
                " must be a positive multiple of the number of ranks W = ", W);
  check_schedule_dtype(backend, dtype, "pipelined llep dispatch");
  MOEPEAK_CHECK(params.chunk_tokens >= 1 && params.max_chunks >= 1 && params.alpha > 0 &&
                    params.min_tokens_per_gemm >= 0,
                "pipelined llep dispatch: chunk_tokens = ", params.chunk_tokens,
                ", max_chunks = ", params.max_chunks, " (>= 1), llep_alpha = ", params.alpha,
                " (> 0), min_tokens_per_gemm = ", params.min_tokens_per_gemm, " (>= 0)");
  MOEPEAK_CHECK(params.slots >= 0 && params.slots <= kPipelinedLlepMaxSlots,
                "pipelined llep dispatch: schedules.llep_slots = ", params.slots,
                " must be in [0, ", kPipelinedLlepMaxSlots, "]");
  llep_helped_limit(num_experts, W, params.llep());  // a refused limit fails here
  local_experts_ = num_experts / W;
  first_expert_ = comm.rank() * local_experts_;
  lane_ = lane ? std::move(lane) : PipelinedLlepLane::make(backend, comm);
  MOEPEAK_CHECK(lane_->comm && lane_->stream && lane_->return_comm && lane_->return_stream &&
                    lane_->comm->world_size() == W && lane_->comm->rank() == comm.rank() &&
                    lane_->return_comm->world_size() == W &&
                    lane_->return_comm->rank() == comm.rank(),
                "pipelined llep dispatch: the lane's communicator is not a duplicate of the "
                "compute stream's (rank ",
                comm.rank(), " of ", W, ")");
  entry_ = backend.create_event();
  copies_ready_ = backend.create_event();
  for (int64_t s = 0; s < kPipelinedLlepMaxSlots; ++s) {
    recv_ready_[s] = backend.create_event();
    computed_[s] = backend.create_event();
    slot_free_[s] = backend.create_event();
  }
}

std::shared_ptr<PipelinedLlepLane> PipelinedLlepLane::make(Backend& backend, Comm& comm) {
  auto lane = std::make_shared<PipelinedLlepLane>();
  lane->comm = comm.duplicate();
  lane->stream = backend.create_stream("pipelined llep dispatch", StreamPriority::high);
  lane->return_comm = comm.duplicate();
  lane->return_stream = backend.create_stream("pipelined llep return", StreamPriority::high);
  return lane;
}

PipelinedLlepDispatch::~PipelinedLlepDispatch() {
  drain();
  release();
}

void PipelinedLlepDispatch::drain() noexcept {
  // NOTES: used on error paths too, where a stream may hold a sticky error: it is dropped here,
  // the error that brought us here is the one the caller sees.
  for (Stream* s : {lane_ ? lane_->stream.get() : nullptr,
                    lane_ ? lane_->return_stream.get() : nullptr, &stream_}) {
    try {
      if (s) s->synchronize();
    } catch (...) {
    }
  }
  retired_.clear();  // every stream has passed every retired pass
}

void PipelinedLlepDispatch::retire_metadata() {
  std::erase_if(retired_, [](const Retired& r) { return r.done->query(); });
  if (!chunks_) return;
  // NOTES: the compute stream has waited for both lanes by the end of a pass (and a pass cut
  // short by an error drained them): an event on it after the pass covers the lanes' copies.
  Retired r{std::move(chunks_), backend_.create_event()};
  r.done->record(stream_);
  retired_.push_back(std::move(r));
  chunks_.reset();
}

OwnedTensor PipelinedLlepDispatch::buffer(Shape shape, DType dtype, const char* what) {
  return OwnedTensor::device(backend_, shape, dtype, LiveSet::dispatch, what);
}

void PipelinedLlepDispatch::exchange_rows(Comm& comm, Stream& stream, const Tensor& send,
                                          const std::vector<int64_t>& send_rows, const Tensor& recv,
                                          const std::vector<int64_t>& recv_rows, int64_t width) {
  schedules::exchange_rows(comm, stream, dtype_, "pipelined llep dispatch", send, send_rows, recv,
                           recv_rows, width);
}

int64_t PipelinedLlepDispatch::max_copies() const {
  return llep_max_copies(num_experts_, comm_.world_size(),
                         std::max<int64_t>(1, shape_.receive_rows), shape_.chunks, params_.llep());
}

const ExpertWeights& PipelinedLlepDispatch::weights_of(int64_t expert,
                                                       const std::vector<ExpertWeights>& local,
                                                       const LlepExpertCopies& copies) const {
  if (expert >= first_expert_ && expert < first_expert_ + local_experts_) {
    return local[static_cast<size_t>(expert - first_expert_)];
  }
  return copies.at(expert);
}

void PipelinedLlepDispatch::copy_metadata(const Chunk& c, const OwnedTensor& token,
                                          const OwnedTensor& slot, Stream& stream) {
  const int64_t m = c.route.sent();
  if (m == 0) return;  // an empty vector's data() may be null, which memcpy must not see
  backend_.copy_async(token.data(), c.route.send_token.data(), m * 4, CopyKind::host_to_device,
                      stream);
  backend_.copy_async(slot.data(), c.route.send_slot.data(), m * 4, CopyKind::host_to_device,
                      stream);
}

void PipelinedLlepDispatch::move_tile_rows(const Chunk& c, const Tile& t, const Tensor& arrival,
                                           const Tensor& tile, bool gather) {
  int64_t at = 0;
  for (size_t i = t.first; i < t.first + t.count; ++i) {
    const Piece& p = c.pieces[i];
    const Tensor slot_rows = arrival.rows(p.begin, p.begin + p.rows);
    const Tensor tile_rows = tile.rows(at, at + p.rows);
    if (!gather && tile.dtype() != arrival.dtype()) {
      ops::convert(tile_rows, slot_rows, stream_);  // an fp32 accumulator rounded once, to bf16
    } else {
      backend_.copy_async(gather ? tile_rows.data() : slot_rows.data(),
                          gather ? slot_rows.data() : tile_rows.data(), slot_rows.nbytes(),
                          CopyKind::device_to_device, stream_);
    }
    at += p.rows;
  }
  MOEPEAK_CHECK(at == t.rows && tile.size(0) == t.rows, "pipelined llep: tile of ", t.rows,
                " rows moved as ", at, " into ", tile.str());
}

// Routing to the host, K from the largest N, every chunk's counts all-gathered, every chunk's
// plan and this rank's layouts. Host metadata only.
void PipelinedLlepDispatch::prepare(const Tensor& x, const Tensor& index, const Tensor& weight) {
  const int64_t N = x.size(0), k = index.size(1), E = num_experts_;
  const int64_t W = comm_.world_size(), me = comm_.rank();
  std::vector<int32_t> host_index(static_cast<size_t>(N * k));
  backend_.copy_async(host_index.data(), index.data(), host_index.size() * 4,
                      CopyKind::device_to_host, stream_);
  // NOTES: host synchronisation 1 of a forward: the chunks' plans and row layouts are made on
  // the host from every token's experts.
  stream_.synchronize();
  for (int32_t e : host_index) {
    MOEPEAK_CHECK(e >= 0 && e < E, "pipelined llep dispatch: expert index ", e,
                  " out of range [0, ", E, ")");
  }
  x_ = x;
  index_ = index;
  weight_ = weight;
  tokens_ = N;
  top_k_ = k;

  // The chunks of a job whose largest N is n_max (every rank runs the same K and c_eff), and
  // this rank's per-chunk expert counts [K][E].
  std::vector<int64_t> local;
  auto chunk_for = [&](int64_t n_max) {
    shape_ = pipelined_llep_shape(n_max, k, hidden_, ffn_, dtype_, W, params_);
    const int64_t K = shape_.chunks, ce = shape_.chunk_tokens;
    chunks_ = std::make_shared<std::vector<Chunk>>(static_cast<size_t>(K));
    local.assign(static_cast<size_t>(K * E), 0);
    for (int64_t i = 0; i < K; ++i) {
      std::vector<int64_t>& t = (*chunks_)[i].tokens;
      if (params_.membership == ChunkMembership::strided) {
        for (int64_t p = i; p < N; p += K) t.push_back(p);
      } else {
        for (int64_t p = i * ce; p < std::min(N, (i + 1) * ce); ++p) t.push_back(p);
      }
      for (int64_t p : t) {
        for (int64_t j = 0; j < k; ++j) ++local[i * E + host_index[p * k + j]];
      }
    }
  };
  // Every rank's `mine` (the same length everywhere), rank-major.
  auto all_gather = [&](const std::vector<int64_t>& mine, const char* what) {
    const int64_t n = static_cast<int64_t>(mine.size());
    std::vector<int64_t> all(static_cast<size_t>(W * n));
    OwnedTensor buf =
        OwnedTensor::device(backend_, Shape{(W + 1) * n}, DType::i64, LiveSet::workspace, what);
    auto* p = buf.data_as<int64_t>();
    backend_.copy_async(p, mine.data(), n * 8, CopyKind::host_to_device, stream_);
    comm_.all_gather(p, p + n, static_cast<size_t>(n), DType::i64, stream_);
    backend_.copy_async(all.data(), p + n, all.size() * 8, CopyKind::device_to_host, stream_);
    // NOTES: host synchronisation 2 of a forward: the plans need every rank's counts. Every
    // rank first assumes the others hold its N (the model's case: B*T/W tokens each), so N
    // travels with the counts of its chunking; only ranks of unequal N exchange again.
    stream_.synchronize();
    return all;
  };
  chunk_for(N);
  // [N, this chunking's counts, zeros up to K_max chunks]: the same length on every rank.
  std::vector<int64_t> mine{N};
  mine.insert(mine.end(), local.begin(), local.end());
  mine.resize(static_cast<size_t>(1 + params_.max_chunks * E), 0);
  std::vector<int64_t> all = all_gather(mine, "pipelined llep tokens and counts");
  const int64_t per_rank = static_cast<int64_t>(mine.size());
  const int64_t counted = static_cast<int64_t>(local.size());
  int64_t n_max = N;
  for (int64_t r = 0; r < W; ++r) n_max = std::max(n_max, all[r * per_rank]);
  bool same = true;
  for (int64_t r = 0; r < W; ++r) same = same && all[r * per_rank] == N;
  if (same) {  // drop the N in front of each rank's counts
    std::vector<int64_t> counts;
    for (int64_t r = 0; r < W; ++r) {
      counts.insert(counts.end(), all.begin() + r * per_rank + 1,
                    all.begin() + r * per_rank + 1 + counted);
    }
    all = std::move(counts);
  } else {
    chunk_for(n_max);
    all = all_gather(local, "pipelined llep counts");
  }
  const int64_t K = shape_.chunks, T = shape_.tile_rows;
  std::vector<Chunk>& chunks = *chunks_;
  counts_.assign(static_cast<size_t>(E), 0);
  plans_.clear();
  transfers_.clear();
  max_received_ = 0;
  const int64_t capacity = std::max<int64_t>(1, shape_.receive_rows);
  std::vector<int64_t> chunk_counts(static_cast<size_t>(W * E));
  // NOTES: each chunk's plan is told which experts the earlier chunks already spilled where, so
  // helping one again is free and the pass's copies stay within max_copies().
  std::vector<uint8_t> helped(static_cast<size_t>(W * E), 0);
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t s = 0; s < W; ++s) {
      for (int64_t e = 0; e < E; ++e) {
        chunk_counts[s * E + e] = all[(s * K + i) * E + e];
        counts_[e] += chunk_counts[s * E + e];
      }
    }
    plans_.push_back(plan_llep(chunk_counts, W, params_.llep(), capacity, helped));
    llep_mark_helped(plans_.back(), helped);
    Chunk& c = chunks[i];
    c.route = make_llep_route(plans_.back(), me, c.tokens, host_index, k);
    // Tiles: the arrival blocks in expert-grouped order (expert, then source), each expert's
    // rows cut into tiles of at most T; a tile's rows are runs (pieces) of arrival rows.
    std::vector<const LlepRoute::Block*> blocks;
    for (const LlepRoute::Block& b : c.route.blocks) blocks.push_back(&b);
    std::stable_sort(
        blocks.begin(), blocks.end(),
        [](const LlepRoute::Block* a, const LlepRoute::Block* b) { return a->expert < b->expert; });
    for (const LlepRoute::Block* b : blocks) {
      for (int64_t done = 0; done < b->rows;) {
        if (c.tiles.empty() || c.tiles.back().expert != b->expert || c.tiles.back().rows == T) {
          c.tiles.push_back({b->expert, 0, c.pieces.size(), 0});
        }
        Tile& t = c.tiles.back();
        const int64_t take = std::min(b->rows - done, T - t.rows);
        c.pieces.push_back({b->begin + done, take});
        t.rows += take;
        ++t.count;
        done += take;
      }
    }
    for (const LlepTransfer& t : llep_transfers(plans_.back())) transfers_.push_back(t);
    max_received_ = std::max(max_received_, c.route.received());
  }
  auto key = [](const LlepTransfer& t) { return std::make_pair(t.expert, t.helper); };
  std::sort(transfers_.begin(), transfers_.end(),
            [&](const LlepTransfer& a, const LlepTransfer& b) { return key(a) < key(b); });
  transfers_.erase(
      std::unique(transfers_.begin(), transfers_.end(),
                  [&](const LlepTransfer& a, const LlepTransfer& b) { return key(a) == key(b); }),
      transfers_.end());
}

void PipelinedLlepDispatch::forward(const Tensor& x, const Tensor& index, const Tensor& weight,
                                    const std::vector<ExpertWeights>& local_experts,
                                    const Tensor& out) {
  const StreamTrafficTag traffic("dispatch");
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1);
  const int64_t El = local_experts_;
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == El,
                "pipelined llep dispatch: ", local_experts.size(), " local experts given, rank ",
                comm_.rank(), " owns ", El, " (E = ", num_experts_, ", W = ", comm_.world_size(),
                ")");
  const bool plan_only = !out.defined();
  MOEPEAK_CHECK(x.dtype() == dtype_ && weight.dtype() == dtype_ &&
                    (plan_only || out.dtype() == dtype_) && index.dtype() == DType::i32,
                "pipelined llep dispatch: x ", x.str(), ", index ", index.str(), ", weight ",
                weight.str(), ", out ", out.str(), " for dtype ", dtype_name(dtype_));
  MOEPEAK_CHECK(index.size(0) == N && weight.size(0) == N && weight.size(1) == k &&
                    (plan_only || (out.ndim() == 2 && out.size(0) == N && out.size(1) == H)),
                "pipelined llep dispatch: index ", index.str(), ", weight ", weight.str(),
                " and out ", out.str(), " for x ", x.str());
  release();
  hidden_ = H;
  ffn_ = local_experts.at(0).w1.size(0);
  check_expert_biases(local_experts, "pipelined llep dispatch");
  prepare(x, index, weight);
  if (!plan_only) {
    try {
      run_forward(local_experts, out);
    } catch (...) {
      drain();
      release();
      throw;
    }
  }
  have_forward_ = true;
}

void PipelinedLlepDispatch::run_forward(const std::vector<ExpertWeights>& local,
                                        const Tensor& out) {
  const int64_t K = shape_.chunks, H = hidden_, F = ffn_, me = comm_.rank();
  if (K == 0) return;
  const int64_t Mc = shape_.rows_per_source, Rc = shape_.receive_rows;
  const int64_t S = shape_.slots, T = shape_.tile_rows, Fb = shape_.ffn_block;
  MOEPEAK_CHECK(S >= 1 && S <= kPipelinedLlepMaxSlots && T >= 1 && Fb >= 1 && F >= 1,
                "pipelined llep: ", S, " slots, tiles of ", T, " rows, F blocks of ", Fb,
                " (F = ", F, ", at least 1 expected)");
  const Tensor weight_rows = weight_.reshape(Shape{tokens_ * top_k_, 1});
  const std::vector<Chunk>& chunks = *chunks_;
  Stream& cs = *lane_->stream;         // the dispatch lane
  Comm& cc = *lane_->comm;             // its communicator
  Stream& rs = *lane_->return_stream;  // the return lane
  Comm& rc = *lane_->return_comm;
  // The fixed buffers: pipelined_llep_forward_bytes, exactly.
  OwnedTensor x_send = buffer(Shape{Mc, H}, dtype_, "llep chunk rows sent");
  // NOTES: with one slot the next dispatch waits for this chunk's combine, so the returned rows
  // can land in the staging buffer; with more it is refilled while they return.
  OwnedTensor y_own;
  if (S >= 2) y_own = buffer(Shape{Mc, H}, dtype_, "llep chunk outputs returned");
  const Tensor y_back = S >= 2 ? y_own.view() : x_send.view();
  OwnedTensor token[kPipelinedLlepMaxSlots], slot[kPipelinedLlepMaxSlots],
      row_weight[kPipelinedLlepMaxSlots], recv[kPipelinedLlepMaxSlots];
  for (int64_t s = 0; s < S; ++s) {
    token[s] = buffer(Shape{Mc}, DType::i32, "llep chunk send token");
    slot[s] = buffer(Shape{Mc}, DType::i32, "llep chunk send slot");
    row_weight[s] = buffer(Shape{Mc}, dtype_, "llep chunk send weight");
    recv[s] = buffer(Shape{Rc, H}, dtype_, "llep chunk received rows");
  }
  OwnedTensor xt = buffer(Shape{T, H}, dtype_, "llep tile rows");
  // NOTES: y sums the tile's F blocks in main_grad_dtype (fp32 beside bf16) and is rounded into
  // the slot once, as the standard schedule's one w2 GEMM rounds it once.
  OwnedTensor yt = buffer(Shape{T, H}, main_grad_dtype(dtype_), "llep tile outputs");
  OwnedTensor a = buffer(Shape{T, Fb}, dtype_, "llep tile w1 block");
  OwnedTensor b = buffer(Shape{T, Fb}, dtype_, "llep tile w3 block");
  OwnedTensor g = buffer(Shape{T, Fb}, dtype_, "llep tile swiglu block");
  const TileBlocks blocks{a.view(), b.view(), g.view(), Tensor()};
  copies_.allocate(backend_, dtype_, transfers_, me, H, F, local[0].has_biases(), false, stream_,
                   max_copies());
  try {
    entry_->record(stream_);
    cs.wait(*entry_);
    rs.wait(*entry_);
    // The spilled experts' weights on the return lane, while chunk 0 is dispatched.
    copies_.send_weights(rc, rs, transfers_, me, first_expert_, local);
    copies_ready_->record(rs);
    for (int64_t i = 0; i < K; ++i) {
      const int s = static_cast<int>(i % S);
      const Chunk& c = chunks[i];
      const LlepRoute& r = c.route;
      const int64_t m = r.sent(), rr = r.received();
      MOEPEAK_CHECK(m <= Mc && rr <= Rc, "pipelined llep: chunk ", i, " sends ", m, " rows (cap ",
                    Mc, ") and receives ", rr, " (cap ", Rc, ")");

      // Dispatch on the dispatch lane, once chunk i-S has left the slot (and, S = 1, the
      // staging buffer).
      if (i >= S) cs.wait(*slot_free_[s]);
      copy_metadata(c, token[s], slot[s], cs);
      ops::gather_rows(weight_rows, slot[s].view().rows(0, m),
                       row_weight[s].view().rows(0, m).reshape(Shape{m, 1}), cs);
      ops::gather_rows(x_, token[s].view().rows(0, m), x_send.view().rows(0, m), cs);
      exchange_rows(cc, cs, x_send.view().rows(0, m), r.send_rows, recv[s].view().rows(0, rr),
                    r.recv_rows, H);
      recv_ready_[s]->record(cs);

      // Experts on the compute stream, tile by tile; each tile's outputs over its inputs in the
      // slot.
      stream_.wait(*recv_ready_[s]);
      if (i == 0) stream_.wait(*copies_ready_);
      const Tensor arrival = recv[s].view().rows(0, rr);  // (rr, H)
      for (const Tile& t : c.tiles) {
        const ExpertWeights& ex = weights_of(t.expert, local, copies_);
        const int64_t n = t.rows, p0 = c.pieces[t.first].begin;
        const bool in_place = t.count == 1;  // one run of arrival rows: read in place
        const Tensor xs = in_place ? arrival.rows(p0, p0 + n) : xt.view().rows(0, n);  // (n, H)
        const Tensor ys = yt.view().rows(0, n);                                        // (n, H)
        if (!in_place) move_tile_rows(c, t, arrival, xs, true);
        // y = sum over F blocks fb of act(x w1[fb]^T, x w3[fb]^T) . w2[:, fb]^T (with biases)
        expert_tile_forward(ex, activation_, Fb, xs, blocks, ys, stream_);
        move_tile_rows(c, t, arrival, ys, false);  // y over x in the slot
      }
      computed_[s]->record(stream_);

      // The slot back in arrival order and combined, on the return lane (in chunk order, so each
      // token still adds its k outputs in expert order).
      rs.wait(*computed_[s]);
      exchange_rows(rc, rs, arrival, r.recv_rows, y_back.rows(0, m), r.send_rows, H);
      for (const LlepRoute::Range& rg : r.combine_ranges) {
        ops::combine_rows(y_back.rows(rg.begin, rg.end), token[s].view().rows(rg.begin, rg.end),
                          row_weight[s].view().rows(rg.begin, rg.end), out, rs);
      }
      slot_free_[s]->record(rs);
    }
    // NOTES: no host synchronisation: the compute stream waits for the last combine (after every
    // dispatch, which it waited for chunk by chunk), so the buffers freed below go back to the
    // arena behind all their uses; a lane's next work waits for the compute stream (entry_).
    stream_.wait(*slot_free_[(K - 1) % S]);
  } catch (...) {
    drain();
    copies_.reset();
    throw;
  }
  copies_.reset();
}

void PipelinedLlepDispatch::backward(const Tensor& dout,
                                     const std::vector<ExpertWeights>& local_experts,
                                     const Tensor& dx, const Tensor& dweight) {
  const StreamTrafficTag traffic("dispatch");
  MOEPEAK_CHECK(have_forward_, "pipelined llep dispatch: backward without a forward to go with it");
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == local_experts_,
                "pipelined llep dispatch: ", local_experts.size(),
                " local experts given to backward, ", local_experts_, " expected");
  check_expert_biases(local_experts, "pipelined llep dispatch backward");
  dout.expect(Shape{tokens_, hidden_}, dtype_, "pipelined llep dispatch dout");
  dx.expect(Shape{tokens_, hidden_}, dtype_, "pipelined llep dispatch dx");
  dweight.expect(Shape{tokens_, top_k_}, dtype_, "pipelined llep dispatch dweight");
  try {
    run_backward(dout, local_experts, dx, dweight);
  } catch (...) {
    drain();
    release();
    throw;
  }
  release();
}

void PipelinedLlepDispatch::run_backward(const Tensor& dout,
                                         const std::vector<ExpertWeights>& local, const Tensor& dx,
                                         const Tensor& dweight) {
  const int64_t K = shape_.chunks, H = hidden_, F = ffn_, me = comm_.rank();
  const int64_t NK = tokens_ * top_k_;
  ops::fill(dweight, 0.0, stream_);
  if (K == 0) return;
  const int64_t Mc = shape_.rows_per_source, Rc = shape_.receive_rows;
  const int64_t S = shape_.slots, T = shape_.tile_rows, Fb = shape_.ffn_block;
  MOEPEAK_CHECK(S >= 1 && S <= kPipelinedLlepMaxSlots && T >= 1 && Fb >= 1 && F >= 1,
                "pipelined llep: ", S, " slots, tiles of ", T, " rows, F blocks of ", Fb,
                " (F = ", F, ", at least 1 expected)");
  const Tensor weight_rows = weight_.reshape(Shape{NK, 1});
  const std::vector<Chunk>& chunks = *chunks_;
  Stream& cs = *lane_->stream;         // the dispatch lane
  Comm& cc = *lane_->comm;             // its communicator
  Stream& rs = *lane_->return_stream;  // the return lane
  Comm& rc = *lane_->return_comm;
  // The fixed buffers: pipelined_llep_backward_bytes, exactly.
  OwnedTensor stage = buffer(Shape{Mc, H}, dtype_, "llep chunk rows sent");
  OwnedTensor w_stage = buffer(Shape{Mc}, dtype_, "llep chunk weights sent");
  // NOTES: as in forward, one slot lets dx and dweight return into the staging buffers.
  OwnedTensor dx_own, dw_own;
  if (S >= 2) {
    dx_own = buffer(Shape{Mc, H}, dtype_, "llep chunk d rows returned");
    dw_own = buffer(Shape{Mc}, dtype_, "llep chunk d weights returned");
  }
  const Tensor dx_back = S >= 2 ? dx_own.view() : stage.view();
  const Tensor dw_back = S >= 2 ? dw_own.view() : w_stage.view();
  OwnedTensor token[kPipelinedLlepMaxSlots], slot[kPipelinedLlepMaxSlots],
      recv_x[kPipelinedLlepMaxSlots], recv_d[kPipelinedLlepMaxSlots],
      recv_w[kPipelinedLlepMaxSlots];
  for (int64_t s = 0; s < S; ++s) {
    token[s] = buffer(Shape{Mc}, DType::i32, "llep chunk send token");
    slot[s] = buffer(Shape{Mc}, DType::i32, "llep chunk send slot");
    recv_x[s] = buffer(Shape{Rc, H}, dtype_, "llep chunk received rows");
    recv_d[s] = buffer(Shape{Rc, H}, dtype_, "llep chunk received d outputs");
    recv_w[s] = buffer(Shape{Rc}, dtype_, "llep chunk received weights");
  }
  OwnedTensor xt = buffer(Shape{T, H}, dtype_, "llep tile rows");
  OwnedTensor dt = buffer(Shape{T, H}, dtype_, "llep tile d outputs");
  // dx and dweight sum the F blocks in main_grad_dtype too (rounded once into the slot).
  OwnedTensor dxt = buffer(Shape{T, H}, main_grad_dtype(dtype_), "llep tile d rows");
  OwnedTensor a = buffer(Shape{T, Fb}, dtype_, "llep tile w1 block");
  OwnedTensor b = buffer(Shape{T, Fb}, dtype_, "llep tile w3 block");
  OwnedTensor g = buffer(Shape{T, Fb}, dtype_, "llep tile swiglu block");
  OwnedTensor dg = buffer(Shape{T, Fb}, dtype_, "llep tile d swiglu block");
  const TileBlocks blocks{a.view(), b.view(), g.view(), dg.view()};
  OwnedTensor wt = buffer(Shape{T}, dtype_, "llep tile weights");
  OwnedTensor dwt = buffer(Shape{T}, main_grad_dtype(dtype_), "llep tile d weights");
  // An owner adds each helper's gradients from this scratch (`grads`, as the gradients are).
  OwnedTensor scratch;
  const bool biases = local[0].has_biases();
  if (llep_owns_a_transfer(transfers_, me)) {
    scratch =
        OwnedTensor::device(backend_, Shape{llep_expert_elements(H, F, biases)},
                            main_grad_dtype(dtype_), LiveSet::grads, "llep returned gradient");
  }
  copies_.allocate(backend_, dtype_, transfers_, me, H, F, biases, true, stream_, max_copies());
  try {
    entry_->record(stream_);
    cs.wait(*entry_);
    rs.wait(*entry_);
    copies_.send_weights(rc, rs, transfers_, me, first_expert_, local);
    copies_ready_->record(rs);
    for (int64_t i = 0; i < K; ++i) {
      const int s = static_cast<int>(i % S);
      const Chunk& c = chunks[i];
      const LlepRoute& r = c.route;
      const int64_t m = r.sent(), rr = r.received();

      // Dispatch on the comm stream: x rows, then dout rows through the one staging buffer, and
      // the routing weights, to the compute ranks.
      if (i >= S) cs.wait(*slot_free_[s]);
      copy_metadata(c, token[s], slot[s], cs);
      const Tensor tok = token[s].view().rows(0, m), sl = slot[s].view().rows(0, m);
      ops::gather_rows(x_, tok, stage.view().rows(0, m), cs);
      exchange_rows(cc, cs, stage.view().rows(0, m), r.send_rows, recv_x[s].view().rows(0, rr),
                    r.recv_rows, H);
      ops::gather_rows(dout, tok, stage.view().rows(0, m), cs);
      exchange_rows(cc, cs, stage.view().rows(0, m), r.send_rows, recv_d[s].view().rows(0, rr),
                    r.recv_rows, H);
      ops::gather_rows(weight_rows, sl, w_stage.view().rows(0, m).reshape(Shape{m, 1}), cs);
      exchange_rows(cc, cs, w_stage.view().rows(0, m), r.send_rows, recv_w[s].view().rows(0, rr),
                    r.recv_rows, 1);
      recv_ready_[s]->record(cs);

      // Recompute and backward tile by tile: dweight and dy from y, then dx over the tile's dout
      // rows and dweight over its weights in the slot, which then go back in arrival order.
      stream_.wait(*recv_ready_[s]);
      if (i == 0) stream_.wait(*copies_ready_);
      const Tensor xa = recv_x[s].view().rows(0, rr), da = recv_d[s].view().rows(0, rr);  // (rr, H)
      const Tensor wa = recv_w[s].view().rows(0, rr);                                     // (rr)
      for (const Tile& t : c.tiles) {
        const ExpertWeights& ex = weights_of(t.expert, local, copies_);
        const int64_t n = t.rows, p0 = c.pieces[t.first].begin;
        const bool in_place = t.count == 1;  // one run of arrival rows: read in place
        const Tensor xs = in_place ? xa.rows(p0, p0 + n) : xt.view().rows(0, n);  // (n, H)
        const Tensor ds = in_place ? da.rows(p0, p0 + n) : dt.view().rows(0, n);  // (n, H)
        const Tensor ws = in_place ? wa.rows(p0, p0 + n) : wt.view().rows(0, n);  // (n)
        if (!in_place) {
          move_tile_rows(c, t, xa, xs, true);
          move_tile_rows(c, t, da, ds, true);
          move_tile_rows(c, t, wa, ws, true);
        }
        const Tensor dxs = dxt.view().rows(0, n), dws = dwt.view().rows(0, n);
        // Per F block, a, b, g recomputed and dy = weight * dout (the combine's backward) never
        // formed: dweight = dout . y summed block by block (no y needed), dx, and the expert's
        // weight (and bias) gradients += (llep_tile_mlp.h).
        expert_tile_backward(ex, activation_, Fb, xs, ds, ws, blocks, dxs, dws, stream_);
        move_tile_rows(c, t, da, dxs, false);  // dx over dout in the slot
        move_tile_rows(c, t, wa, dws, false);  // dweight over the (used) weights
      }
      computed_[s]->record(stream_);

      // dx and dweight back and added, on the return lane, in chunk order.
      rs.wait(*computed_[s]);
      exchange_rows(rc, rs, da, r.recv_rows, dx_back.rows(0, m), r.send_rows, H);
      exchange_rows(rc, rs, wa, r.recv_rows, dw_back.rows(0, m), r.send_rows, 1);
      for (const LlepRoute::Range& rg : r.combine_ranges) {
        ops::scatter_add_rows(dx_back.rows(rg.begin, rg.end),
                              token[s].view().rows(rg.begin, rg.end), dx, rs);
      }
      ops::scatter_add_rows(dw_back.rows(0, m).reshape(Shape{m, 1}), slot[s].view().rows(0, m),
                            dweight.reshape(Shape{NK, 1}), rs);
      slot_free_[s]->record(rs);
    }
    // Spilled experts' gradients, summed over the chunks on their helpers, back to the owners
    // (on the compute stream, which computed them), while the last chunks return.
    copies_.return_grads(comm_, stream_, transfers_, me, first_expert_, local, scratch);
    // NOTES: no host synchronisation, as in forward.
    stream_.wait(*slot_free_[(K - 1) % S]);
  } catch (...) {
    drain();
    copies_.reset();
    throw;
  }
  copies_.reset();
}

void PipelinedLlepDispatch::release() {
  have_forward_ = false;
  x_ = Tensor();
  index_ = Tensor();
  weight_ = Tensor();
  retire_metadata();
  transfers_.clear();
  copies_.reset();
}

}  // namespace moepeak::schedules
