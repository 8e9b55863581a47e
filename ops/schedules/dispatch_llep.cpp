// LlepDispatch: ExpertParallelDispatch's single exchange, with the rows placed by the LLEP plan
// (see the header for orders, exactness and memory). Every step runs on one stream, comm
// included, so a buffer released on the host while queued work still uses it is safe.
// Test: ctest -R test_llep
#include "ops/schedules/dispatch_llep.h"

#include <algorithm>

#include "core/error.h"
#include "core/runtime/stream_profile.h"
#include "ops/fill.h"
#include "ops/permute.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/schedule_dtype.h"

namespace moepeak::schedules {

uint64_t llep_dispatch_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                             DType dtype, int64_t world, const LlepParams& params) {
  const int64_t R = llep_receive_capacity(tokens * top_k, world, params);
  return dispatch_expert_parallel_bytes(tokens, top_k, hidden, ffn, dtype, R);
}

LlepDispatch::LlepDispatch(Backend& backend, Stream& stream, Comm& comm, DType dtype,
                           int64_t num_experts, const LlepParams& params,
                           const ops::SwigluParams& activation)
    : backend_(backend),
      stream_(stream),
      comm_(comm),
      dtype_(dtype),
      params_(params),
      activation_(activation),
      num_experts_(num_experts) {
  ops::check_swiglu_params("llep dispatch", activation);
  const int64_t W = comm.world_size();
  MOEPEAK_CHECK(num_experts > 0 && num_experts % W == 0,
                "llep dispatch: the number of experts E = ", num_experts,
                " must be a positive multiple of the number of ranks W = ", W);
  check_schedule_dtype(backend, dtype, "llep dispatch");
  MOEPEAK_CHECK(params.alpha > 0 && params.min_tokens_per_gemm >= 0,
                "llep dispatch: alpha = ", params.alpha,
                " (> 0), min_tokens_per_gemm = ", params.min_tokens_per_gemm, " (>= 0)");
  llep_helped_limit(num_experts, W, params);  // a refused limit fails here, not mid-step
  local_experts_ = num_experts / W;
  first_expert_ = comm.rank() * local_experts_;
}

void LlepDispatch::exchange_rows(const Tensor& send, const std::vector<int64_t>& send_rows,
                                 const Tensor& recv, const std::vector<int64_t>& recv_rows,
                                 int64_t width) {
  schedules::exchange_rows(comm_, stream_, dtype_, "llep dispatch", send, send_rows, recv,
                           recv_rows, width);
}

const ExpertWeights& LlepDispatch::weights_of(int64_t expert,
                                              const std::vector<ExpertWeights>& local) const {
  if (expert >= first_expert_ && expert < first_expert_ + local_experts_) {
    return local[static_cast<size_t>(expert - first_expert_)];
  }
  return copies_.at(expert);
}

std::vector<ExpertWeights> LlepDispatch::computed_weights(
    const std::vector<ExpertWeights>& local) const {
  std::vector<ExpertWeights> out;
  out.reserve(computed_experts_.size());
  for (int64_t e : computed_experts_) out.push_back(weights_of(e, local));
  return out;
}

void LlepDispatch::forward(const Tensor& x, const Tensor& index, const Tensor& weight,
                           const std::vector<ExpertWeights>& local_experts, const Tensor& out) {
  const StreamTrafficTag traffic("dispatch");
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1);
  const int64_t E = num_experts_, El = local_experts_, W = comm_.world_size(), me = comm_.rank();
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == El,
                "llep dispatch: ", local_experts.size(), " local experts given, rank ", me,
                " owns ", El, " (E = ", E, ", W = ", W, ")");
  const int64_t F = local_experts.at(0).w1.size(0);
  check_expert_biases(local_experts, "llep dispatch");
  MOEPEAK_CHECK(x.dtype() == dtype_ && weight.dtype() == dtype_ && out.dtype() == dtype_ &&
                    index.dtype() == DType::i32,
                "llep dispatch: x ", x.str(), ", index ", index.str(), ", weight ", weight.str(),
                ", out ", out.str(), " for dtype ", dtype_name(dtype_));
  MOEPEAK_CHECK(index.size(0) == N && weight.size(0) == N && weight.size(1) == k &&
                    out.size(0) == N && out.size(1) == H,
                "llep dispatch: index ", index.str(), ", weight ", weight.str(), " and out ",
                out.str(), " for x ", x.str());
  release();
  tokens_ = N;
  top_k_ = k;
  const int64_t M = N * k;

  std::vector<int32_t> host_index(static_cast<size_t>(M));
  backend_.copy_async(host_index.data(), index.data(), host_index.size() * 4,
                      CopyKind::device_to_host, stream_);
  stream_.synchronize();
  // Row counts per expert and N, from every rank: [counts (E), N] each.
  std::vector<int64_t> mine(static_cast<size_t>(E + 1), 0), all(static_cast<size_t>(W * (E + 1)));
  for (int32_t e : host_index) {
    MOEPEAK_CHECK(e >= 0 && e < E, "llep dispatch: expert index ", e, " out of range [0, ", E, ")");
    ++mine[static_cast<size_t>(e)];
  }
  mine[E] = N;
  {
    OwnedTensor buf = OwnedTensor::device(backend_, Shape{(W + 1) * (E + 1)}, DType::i64,
                                          LiveSet::workspace, "llep counts");
    auto* p = buf.data_as<int64_t>();
    backend_.copy_async(p, mine.data(), (E + 1) * 8, CopyKind::host_to_device, stream_);
    comm_.all_gather(p, p + E + 1, static_cast<size_t>(E + 1), DType::i64, stream_);
    backend_.copy_async(all.data(), p + E + 1, all.size() * 8, CopyKind::device_to_host, stream_);
    stream_.synchronize();
  }
  std::vector<int64_t> counts(static_cast<size_t>(W * E));
  int64_t max_tokens = 0;
  counts_.assign(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < W; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      counts[s * E + e] = all[s * (E + 1) + e];
      counts_[e] += counts[s * E + e];
    }
    max_tokens = std::max(max_tokens, all[s * (E + 1) + E]);
  }
  const int64_t capacity = std::max<int64_t>(1, llep_receive_capacity(max_tokens * k, W, params_));
  plan_ = plan_llep(counts, W, params_, capacity);
  std::vector<int64_t> tokens(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) tokens[n] = n;
  route_ = make_llep_route(plan_, me, tokens, host_index, k);
  transfers_ = llep_transfers(plan_);
  const int64_t R = route_.received();
  received_rows_ = R;

  // Spilled experts' weights to their helpers (gradient copies zeroed for backward).
  copies_.allocate(backend_, dtype_, transfers_, me, H, F, local_experts[0].has_biases(),
                   /*with_grads=*/true, stream_, llep_max_copies(E, W, capacity, 1, params_));
  copies_.send_weights(comm_, stream_, transfers_, me, first_expert_, local_experts);

  // Grouped order on this rank: expert (ascending), source, arrival.
  // perm[grouped row] = arrival row; inv_perm[arrival row] = grouped row.
  std::vector<int32_t> perm(static_cast<size_t>(R)), inv_perm(static_cast<size_t>(R));
  computed_experts_.clear();
  expert_offsets_.assign(1, 0);
  {
    std::vector<const LlepRoute::Block*> by_expert;
    for (const LlepRoute::Block& b : route_.blocks) by_expert.push_back(&b);
    std::stable_sort(
        by_expert.begin(), by_expert.end(),
        [](const LlepRoute::Block* a, const LlepRoute::Block* b) { return a->expert < b->expert; });
    int64_t grouped = 0;
    for (const LlepRoute::Block* b : by_expert) {
      if (computed_experts_.empty() || computed_experts_.back() != b->expert) {
        if (!computed_experts_.empty()) expert_offsets_.push_back(grouped);
        computed_experts_.push_back(b->expert);
      }
      for (int64_t i = 0; i < b->rows; ++i, ++grouped) {
        perm[grouped] = static_cast<int32_t>(b->begin + i);
        inv_perm[b->begin + i] = static_cast<int32_t>(grouped);
      }
    }
    if (!computed_experts_.empty()) expert_offsets_.push_back(grouped);
  }

  // From here the buffers of ExpertParallelDispatch, allocated in the same order.
  send_token_ =
      OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "send token");
  send_slot_ = OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "send slot");
  send_weight_ = OwnedTensor::device(backend_, Shape{M}, dtype_, LiveSet::dispatch, "send weight");
  backend_.copy_async(send_token_.data(), route_.send_token.data(), M * 4, CopyKind::host_to_device,
                      stream_);
  backend_.copy_async(send_slot_.data(), route_.send_slot.data(), M * 4, CopyKind::host_to_device,
                      stream_);
  ops::gather_rows(weight.reshape(Shape{M, 1}), send_slot_,
                   send_weight_.view().reshape(Shape{M, 1}), stream_);
  OwnedTensor x_send =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "sent rows");
  ops::gather_rows(x, send_token_, x_send, stream_);
  perm_ = OwnedTensor::device(backend_, Shape{R}, DType::i32, LiveSet::dispatch, "arrival row");
  inv_perm_ = OwnedTensor::device(backend_, Shape{R}, DType::i32, LiveSet::dispatch, "grouped row");
  backend_.copy_async(perm_.data(), perm.data(), R * 4, CopyKind::host_to_device, stream_);
  backend_.copy_async(inv_perm_.data(), inv_perm.data(), R * 4, CopyKind::host_to_device, stream_);
  OwnedTensor x_recv =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "received rows");
  exchange_rows(x_send, route_.send_rows, x_recv, route_.recv_rows, H);
  x_send.reset();
  x_rows_ =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "dispatched rows");
  ops::gather_rows(x_recv, perm_, x_rows_, stream_);
  x_recv.reset();

  a_ = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "expert w1 rows");
  b_ = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "expert w3 rows");
  OwnedTensor y_rows =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "expert outputs");
  {
    OwnedTensor g = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "swiglu");
    all_experts_forward(computed_weights(local_experts), expert_offsets_, activation_, x_rows_, a_,
                        b_, g, y_rows, stream_);
  }
  OwnedTensor y_arrival =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "outputs to return");
  ops::gather_rows(y_rows, inv_perm_, y_arrival, stream_);
  y_rows.reset();
  y_back_ =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "returned outputs");
  exchange_rows(y_arrival, route_.recv_rows, y_back_, route_.send_rows, H);
  y_arrival.reset();
  // Expert by expert, so each token adds its k outputs in expert order (as the standard does).
  for (const LlepRoute::Range& r : route_.combine_ranges) {
    ops::combine_rows(y_back_.view().rows(r.begin, r.end), send_token_.view().rows(r.begin, r.end),
                      send_weight_.view().rows(r.begin, r.end), out, stream_);
  }
  have_forward_ = true;
  stream_.synchronize();  // the host vectors above are read by queued copies
}

void LlepDispatch::backward(const Tensor& dout, const std::vector<ExpertWeights>& local_experts,
                            const Tensor& dx, const Tensor& dweight) {
  const StreamTrafficTag traffic("dispatch");
  MOEPEAK_CHECK(have_forward_, "llep dispatch: backward without a forward to go with it");
  const int64_t N = tokens_, k = top_k_, M = N * k, R = received_rows_;
  const int64_t H = x_rows_.shape()[1], F = a_.shape()[1], El = local_experts_;
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == El,
                "llep dispatch: ", local_experts.size(), " local experts given to backward, ", El,
                " expected");
  check_expert_biases(local_experts, "llep dispatch backward");
  dout.expect(Shape{N, H}, dtype_, "llep dispatch dout");
  dx.expect(Shape{N, H}, dtype_, "llep dispatch dx");
  dweight.expect(Shape{N, k}, dtype_, "llep dispatch dweight");
  const int64_t me = comm_.rank();

  combine_backward_on_source(backend_, stream_, dtype_, dout, y_back_, send_token_, send_weight_,
                             send_slot_, dweight);
  send_slot_.reset();
  send_weight_.reset();
  OwnedTensor dy_rows;
  {
    OwnedTensor dy_recv =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "received d outputs");
    exchange_rows(y_back_, route_.send_rows, dy_recv, route_.recv_rows, H);
    y_back_.reset();
    dy_rows =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "d expert outputs");
    ops::gather_rows(dy_recv, perm_, dy_rows, stream_);
  }
  OwnedTensor dx_rows =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "d dispatched rows");
  {
    OwnedTensor g = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "swiglu");
    OwnedTensor dg =
        OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "d swiglu");
    OwnedTensor da =
        OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "d w1 rows");
    OwnedTensor db =
        OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "d w3 rows");
    // Native experts accumulate into their own gradients, spilled ones into the copies'.
    all_experts_backward(computed_weights(local_experts), expert_offsets_, activation_, x_rows_, a_,
                         b_, dy_rows, g, dg, da, db, dx_rows, stream_);
  }
  dy_rows.reset();
  x_rows_.reset();
  a_.reset();
  b_.reset();
  {
    OwnedTensor dx_arrival =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "d rows to return");
    ops::gather_rows(dx_rows, inv_perm_, dx_arrival, stream_);
    dx_rows.reset();
    perm_.reset();
    inv_perm_.reset();
    OwnedTensor dx_back =
        OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "returned d rows");
    exchange_rows(dx_arrival, route_.recv_rows, dx_back, route_.send_rows, H);
    dx_arrival.reset();
    for (const LlepRoute::Range& r : route_.combine_ranges) {
      ops::scatter_add_rows(dx_back.view().rows(r.begin, r.end),
                            send_token_.view().rows(r.begin, r.end), dx, stream_);
    }
  }
  // Spilled experts' gradients back to their owners, added there.
  if (!transfers_.empty()) {
    OwnedTensor scratch;
    if (llep_owns_a_transfer(transfers_, me)) {
      scratch = OwnedTensor::device(
          backend_, Shape{llep_expert_elements(H, F, local_experts.at(0).has_biases())},
          main_grad_dtype(dtype_), LiveSet::grads, "llep returned gradient");
    }
    copies_.return_grads(comm_, stream_, transfers_, me, first_expert_, local_experts, scratch);
    stream_.synchronize();
  }
  release();
}

void LlepDispatch::release() {
  have_forward_ = false;
  send_token_.reset();
  send_slot_.reset();
  send_weight_.reset();
  y_back_.reset();
  perm_.reset();
  inv_perm_.reset();
  x_rows_.reset();
  a_.reset();
  b_.reset();
  copies_.reset();
}

}  // namespace moepeak::schedules
