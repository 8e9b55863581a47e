// ExpertParallelDispatch: the standard all-to-all expert-parallel dispatcher (see the header for
// the row orders and shapes). Every step runs on one stream, comm included, so a buffer released
// on the host while queued work still uses it is safe: its next owner's work is queued later.
#include "ops/schedules/dispatch_expert_parallel.h"

#include <algorithm>

#include "core/error.h"
#include "core/runtime/stream_profile.h"
#include "ops/fill.h"
#include "ops/permute.h"
#include "ops/schedules/schedule_dtype.h"

namespace moepeak::schedules {

uint64_t dispatch_expert_parallel_bytes(int64_t tokens_local, int64_t top_k, int64_t hidden,
                                        int64_t ffn, DType dtype, int64_t received_rows) {
  MOEPEAK_CHECK(tokens_local >= 0 && top_k >= 0 && hidden >= 0 && ffn >= 0 && received_rows >= 0,
                "dispatch_expert_parallel_bytes: negative size (tokens ", tokens_local, ", top_k ",
                top_k, ", hidden ", hidden, ", ffn ", ffn, ", received rows ", received_rows, ")");
  const uint64_t M = static_cast<uint64_t>(tokens_local * top_k);
  const uint64_t R = static_cast<uint64_t>(received_rows), b = dtype_size(dtype);
  const uint64_t H = static_cast<uint64_t>(hidden), F = static_cast<uint64_t>(ffn);
  auto fp = [](uint64_t bytes) { return DeviceArena::footprint(bytes); };
  const uint64_t send_h = fp(M * H * b);                          // x_send, y_back, dx_back
  const uint64_t recv_h = fp(R * H * b), recv_f = fp(R * F * b);  // owner rows
  const uint64_t send_perm = 2 * fp(M * 4) + fp(M * b);           // token, slot, weight
  const uint64_t recv_perm = 2 * fp(R * 4);                       // perm, inverse
  // Forward, with the permutations, x_rows, a, b held throughout the expert phase:
  //   x_send + x_recv, then x_recv + x_rows               (both below the GEMM phase)
  //   GEMMs:            g, y_rows                       -> + recv_f + recv_h
  //   arrival order:    y_rows, y_arrival               -> + 2 recv_h
  //   return trip:      y_arrival, y_back               -> + recv_h + send_h
  const uint64_t forward_kept = send_perm + recv_perm + recv_h + 2 * recv_f;
  const uint64_t forward = forward_kept + std::max({recv_f + recv_h, 2 * recv_h, recv_h + send_h});
  // Backward: y_back (holding dy in place) and the forward's buffers on entry.
  //   row-weight gradient (M):   everything saved + fp(M b)
  //   dy to the owners:          send token, y_back, owner buffers, dy_recv
  //   expert GEMMs:              send token, owner buffers, dy_rows, dx_rows, g, dg, da, db
  // (dy_recv + dy_rows, then dx_rows + dx_arrival, then dx_arrival + dx_back stay below these.)
  const uint64_t owner_kept = recv_perm + recv_h + 2 * recv_f;
  const uint64_t row_weight_grad = send_perm + send_h + owner_kept + fp(M * b);
  const uint64_t dy_exchange = fp(M * 4) + send_h + owner_kept + recv_h;
  const uint64_t expert_backward = fp(M * 4) + owner_kept + 2 * recv_h + 4 * recv_f;
  return std::max({forward, row_weight_grad, dy_exchange, expert_backward});
}

ExpertParallelDispatch::ExpertParallelDispatch(Backend& backend, Stream& stream, Comm& comm,
                                               DType dtype, int64_t num_experts,
                                               const ops::SwigluParams& activation)
    : backend_(backend),
      stream_(stream),
      comm_(comm),
      dtype_(dtype),
      activation_(activation),
      num_experts_(num_experts) {
  ops::check_swiglu_params("expert parallel dispatch", activation);
  const int64_t W = comm.world_size();
  MOEPEAK_CHECK(num_experts > 0 && W > 0 && num_experts % W == 0,
                "expert parallel dispatch: the number of experts E = ", num_experts,
                " must be a positive multiple of the number of ranks W = ", W);
  check_schedule_dtype(backend, dtype, "expert parallel dispatch");
  local_experts_ = num_experts / W;
  first_expert_ = comm.rank() * local_experts_;
}

void combine_backward_on_source(Backend& backend, Stream& stream, DType dtype, const Tensor& dout,
                                const Tensor& y_back, const Tensor& send_token,
                                const Tensor& send_weight, const Tensor& send_slot,
                                const Tensor& dweight) {
  const int64_t M = send_token.numel();
  OwnedTensor drow_weight =
      OwnedTensor::device(backend, Shape{M}, dtype, LiveSet::dispatch, "d send weight");
  ops::combine_rows_backward(dout, y_back, send_token, send_weight, y_back, drow_weight, stream);
  ops::fill(dweight, 0.0, stream);
  ops::scatter_add_rows(drow_weight.view().reshape(Shape{M, 1}), send_slot,
                        dweight.reshape(Shape{dweight.numel(), 1}), stream);
}

void exchange_rows(Comm& comm, Stream& stream, DType dtype, const char* who, const Tensor& send,
                   const std::vector<int64_t>& send_rows, const Tensor& recv,
                   const std::vector<int64_t>& recv_rows, int64_t width) {
  const size_t W = send_rows.size();
  std::vector<size_t> sc(W), so(W), rc(W), ro(W);
  size_t s_at = 0, r_at = 0;
  for (size_t p = 0; p < W; ++p) {
    sc[p] = static_cast<size_t>(send_rows[p] * width);
    rc[p] = static_cast<size_t>(recv_rows[p] * width);
    so[p] = s_at;
    ro[p] = r_at;
    s_at += sc[p];
    r_at += rc[p];
  }
  MOEPEAK_CHECK(
      s_at == static_cast<size_t>(send.numel()) && r_at == static_cast<size_t>(recv.numel()), who,
      ": exchange of ", s_at, " / ", r_at, " elements for ", send.str(), " / ", recv.str());
  comm.all_to_all_v(send.data(), sc, so, recv.data(), rc, ro, dtype, stream);
}

void ExpertParallelDispatch::exchange_rows(const Tensor& send,
                                           const std::vector<int64_t>& send_rows,
                                           const Tensor& recv,
                                           const std::vector<int64_t>& recv_rows, int64_t width) {
  schedules::exchange_rows(comm_, stream_, dtype_, "expert parallel dispatch", send, send_rows,
                           recv, recv_rows, width);
}

void ExpertParallelDispatch::forward(const Tensor& x, const Tensor& index, const Tensor& weight,
                                     const std::vector<ExpertWeights>& local_experts,
                                     const Tensor& out) {
  const StreamTrafficTag traffic("dispatch");
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1);
  const int64_t E = num_experts_, El = local_experts_, W = comm_.world_size();
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == El,
                "expert parallel dispatch: ", local_experts.size(), " local experts given, rank ",
                comm_.rank(), " owns ", El, " (E = ", E, ", W = ", W, ")");
  const int64_t F = local_experts.at(0).w1.size(0);
  check_expert_biases(local_experts, "expert parallel dispatch");
  MOEPEAK_CHECK(x.dtype() == dtype_ && weight.dtype() == dtype_ && out.dtype() == dtype_ &&
                    index.dtype() == DType::i32,
                "expert parallel dispatch: x ", x.str(), ", index ", index.str(), ", weight ",
                weight.str(), ", out ", out.str(), " for dtype ", dtype_name(dtype_));
  MOEPEAK_CHECK(index.size(0) == N && weight.size(0) == N && weight.size(1) == k &&
                    out.size(0) == N && out.size(1) == H,
                "expert parallel dispatch: index ", index.str(), ", weight ", weight.str(),
                " and out ", out.str(), " for x ", x.str());
  release();
  tokens_ = N;
  top_k_ = k;
  const int64_t M = N * k;

  // Routing decisions to the host: this schedule sizes its buffers by them.
  std::vector<int32_t> host_index(static_cast<size_t>(M));
  backend_.copy_async(host_index.data(), index.data(), host_index.size() * 4,
                      CopyKind::device_to_host, stream_);
  stream_.synchronize();
  std::vector<int64_t> local_counts(static_cast<size_t>(E), 0);
  for (int32_t e : host_index) {
    MOEPEAK_CHECK(e >= 0 && e < E, "expert parallel dispatch: expert index ", e,
                  " out of range [0, ", E, ")");
    ++local_counts[static_cast<size_t>(e)];
  }

  // Rows per (destination, local expert) to the owners, and the global counts for metrics. The
  // local counts are already laid out destination by destination (E/W experts each).
  std::vector<int64_t> recv_counts(static_cast<size_t>(E));
  counts_.assign(static_cast<size_t>(E), 0);
  {
    OwnedTensor cnt = OwnedTensor::device(backend_, Shape{3, E}, DType::i64, LiveSet::workspace,
                                          "dispatch counts");
    auto* send_cnt = cnt.data_as<int64_t>();
    backend_.copy_async(send_cnt, local_counts.data(), E * 8, CopyKind::host_to_device, stream_);
    std::vector<size_t> per_peer(static_cast<size_t>(W), static_cast<size_t>(El)), offsets(W);
    for (int64_t p = 0; p < W; ++p) offsets[p] = static_cast<size_t>(p * El);
    comm_.all_to_all_v(send_cnt, per_peer, offsets, send_cnt + E, per_peer, offsets, DType::i64,
                       stream_);
    comm_.all_reduce(send_cnt, send_cnt + 2 * E, static_cast<size_t>(E), DType::i64, ReduceOp::sum,
                     stream_);
    backend_.copy_async(recv_counts.data(), send_cnt + E, E * 8, CopyKind::device_to_host, stream_);
    backend_.copy_async(counts_.data(), send_cnt + 2 * E, E * 8, CopyKind::device_to_host, stream_);
    stream_.synchronize();
  }
  send_rows_.assign(static_cast<size_t>(W), 0);
  recv_rows_.assign(static_cast<size_t>(W), 0);
  for (int64_t p = 0; p < W; ++p) {
    for (int64_t l = 0; l < El; ++l) {
      send_rows_[p] += local_counts[p * El + l];
      recv_rows_[p] += recv_counts[p * El + l];
    }
  }
  int64_t R = 0;
  for (int64_t v : recv_rows_) R += v;
  received_rows_ = R;

  // Send order: destination, expert, token (expert-major: experts are numbered by owner).
  std::vector<int64_t> fill_at(static_cast<size_t>(E), 0);
  for (int64_t e = 1; e < E; ++e) fill_at[e] = fill_at[e - 1] + local_counts[e - 1];
  std::vector<int32_t> token(static_cast<size_t>(M)), slot(static_cast<size_t>(M));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      int64_t row = fill_at[host_index[n * k + j]]++;
      token[row] = static_cast<int32_t>(n);
      slot[row] = static_cast<int32_t>(n * k + j);
    }
  }
  // Grouped order on the owner: local expert, then source rank (then token, as sent).
  // perm[grouped row] = arrival row; inv_perm[arrival row] = grouped row.
  std::vector<int32_t> perm(static_cast<size_t>(R)), inv_perm(static_cast<size_t>(R));
  expert_offsets_.assign(static_cast<size_t>(El) + 1, 0);
  {
    std::vector<int64_t> arrival_at(static_cast<size_t>(E));  // (source, local expert) block start
    int64_t at = 0;
    for (int64_t s = 0; s < W; ++s) {
      for (int64_t l = 0; l < El; ++l) {
        arrival_at[s * El + l] = at;
        at += recv_counts[s * El + l];
      }
    }
    int64_t grouped = 0;
    for (int64_t l = 0; l < El; ++l) {
      for (int64_t s = 0; s < W; ++s) {
        for (int64_t i = 0; i < recv_counts[s * El + l]; ++i, ++grouped) {
          int64_t arrival = arrival_at[s * El + l] + i;
          perm[grouped] = static_cast<int32_t>(arrival);
          inv_perm[arrival] = static_cast<int32_t>(grouped);
        }
      }
      expert_offsets_[l + 1] = grouped;
    }
  }

  send_token_ =
      OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "send token");
  send_slot_ = OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "send slot");
  send_weight_ = OwnedTensor::device(backend_, Shape{M}, dtype_, LiveSet::dispatch, "send weight");
  backend_.copy_async(send_token_.data(), token.data(), M * 4, CopyKind::host_to_device, stream_);
  backend_.copy_async(send_slot_.data(), slot.data(), M * 4, CopyKind::host_to_device, stream_);
  ops::gather_rows(weight.reshape(Shape{M, 1}), send_slot_,
                   send_weight_.view().reshape(Shape{M, 1}), stream_);

  // Tokens to the owners of their experts.
  OwnedTensor x_send =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "sent rows");
  ops::gather_rows(x, send_token_, x_send, stream_);
  perm_ = OwnedTensor::device(backend_, Shape{R}, DType::i32, LiveSet::dispatch, "arrival row");
  inv_perm_ = OwnedTensor::device(backend_, Shape{R}, DType::i32, LiveSet::dispatch, "grouped row");
  backend_.copy_async(perm_.data(), perm.data(), R * 4, CopyKind::host_to_device, stream_);
  backend_.copy_async(inv_perm_.data(), inv_perm.data(), R * 4, CopyKind::host_to_device, stream_);
  OwnedTensor x_recv =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "received rows");
  exchange_rows(x_send, send_rows_, x_recv, recv_rows_, H);
  x_send.reset();
  x_rows_ =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "dispatched rows");
  ops::gather_rows(x_recv, perm_, x_rows_, stream_);
  x_recv.reset();

  // The experts: the same GEMMs as StandardDispatch, each local expert on its rows (one grouped
  // GEMM per projection, all_experts_forward).
  a_ = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "expert w1 rows");
  b_ = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "expert w3 rows");
  OwnedTensor y_rows =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "expert outputs");
  {
    OwnedTensor g = OwnedTensor::device(backend_, Shape{R, F}, dtype_, LiveSet::dispatch, "swiglu");
    all_experts_forward(local_experts, expert_offsets_, activation_, x_rows_, a_, b_, g, y_rows,
                        stream_);
  }
  // Back to arrival order, back to the sources, combined there in send (expert-major) order.
  OwnedTensor y_arrival =
      OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "outputs to return");
  ops::gather_rows(y_rows, inv_perm_, y_arrival, stream_);
  y_rows.reset();
  y_back_ =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "returned outputs");
  exchange_rows(y_arrival, recv_rows_, y_back_, send_rows_, H);
  y_arrival.reset();
  ops::combine_rows(y_back_, send_token_, send_weight_, out, stream_);
  have_forward_ = true;
  // The host vectors above are read by queued copies: finish them before the vectors die.
  stream_.synchronize();
}

void ExpertParallelDispatch::backward(const Tensor& dout,
                                      const std::vector<ExpertWeights>& local_experts,
                                      const Tensor& dx, const Tensor& dweight) {
  const StreamTrafficTag traffic("dispatch");
  MOEPEAK_CHECK(have_forward_,
                "expert parallel dispatch: backward without a forward to go with it");
  const int64_t N = tokens_, k = top_k_, M = N * k, R = received_rows_;
  const int64_t H = x_rows_.shape()[1], F = a_.shape()[1], El = local_experts_;
  MOEPEAK_CHECK(static_cast<int64_t>(local_experts.size()) == El,
                "expert parallel dispatch: ", local_experts.size(),
                " local experts given to backward, ", El, " expected");
  check_expert_biases(local_experts, "expert parallel dispatch backward");
  dout.expect(Shape{N, H}, dtype_, "expert parallel dispatch dout");
  dx.expect(Shape{N, H}, dtype_, "expert parallel dispatch dx");
  dweight.expect(Shape{N, k}, dtype_, "expert parallel dispatch dweight");

  // On the source: dy rows (in place of the returned outputs) and the routing weights' gradient.
  combine_backward_on_source(backend_, stream_, dtype_, dout, y_back_, send_token_, send_weight_,
                             send_slot_, dweight);
  send_slot_.reset();
  send_weight_.reset();
  // dy to the owners, grouped per expert there.
  OwnedTensor dy_rows;
  {
    OwnedTensor dy_recv =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "received d outputs");
    exchange_rows(y_back_, send_rows_, dy_recv, recv_rows_, H);
    y_back_.reset();
    dy_rows =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "d expert outputs");
    ops::gather_rows(dy_recv, perm_, dy_rows, stream_);
  }
  // Expert backward (g recomputed from a, b as StandardDispatch does): dx rows, dW +=.
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
    all_experts_backward(local_experts, expert_offsets_, activation_, x_rows_, a_, b_, dy_rows, g,
                         dg, da, db, dx_rows, stream_);
  }
  dy_rows.reset();
  x_rows_.reset();
  a_.reset();
  b_.reset();
  // dx rows back to arrival order, back to the sources, added into dx in send order.
  {
    OwnedTensor dx_arrival =
        OwnedTensor::device(backend_, Shape{R, H}, dtype_, LiveSet::dispatch, "d rows to return");
    ops::gather_rows(dx_rows, inv_perm_, dx_arrival, stream_);
    dx_rows.reset();
    perm_.reset();
    inv_perm_.reset();
    OwnedTensor dx_back =
        OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "returned d rows");
    exchange_rows(dx_arrival, recv_rows_, dx_back, send_rows_, H);
    dx_arrival.reset();
    ops::scatter_add_rows(dx_back, send_token_, dx, stream_);
  }
  release();
}

void ExpertParallelDispatch::release() {
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
}

}  // namespace moepeak::schedules
