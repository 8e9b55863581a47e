#include "ops/schedules/dispatch_standard.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "core/error.h"
#include "ops/fill.h"
#include "ops/grouped_bias.h"
#include "ops/grouped_linear.h"
#include "ops/permute.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

uint64_t dispatch_standard_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                 DType dtype, int64_t layers_resident) {
  const uint64_t M = static_cast<uint64_t>(tokens * top_k), b = dtype_size(dtype);
  auto fp = [](uint64_t bytes) { return DeviceArena::footprint(bytes); };
  const uint64_t rows_h = fp(M * hidden * b), rows_f = fp(M * ffn * b);
  const uint64_t permutation = 2 * fp(M * 4) + fp(M * b);  // row token, row slot, row weight
  // Forward peak: x_rows, y_rows, a, b, the SwiGLU temporary g.
  const uint64_t forward = 2 * rows_h + 3 * rows_f + permutation;
  // Backward peak (y_rows already released): x_rows, a, b kept; dy, dx_rows, d row weight;
  // g, dg, da, db.
  const uint64_t backward = 3 * rows_h + 6 * rows_f + permutation + fp(M * b);
  const uint64_t saved = 2 * rows_h + 2 * rows_f + permutation;  // what forward keeps for backward
  return std::max(forward, backward) + static_cast<uint64_t>(layers_resident - 1) * saved;
}

void check_expert_biases(const std::vector<ExpertWeights>& experts, const char* who) {
  if (experts.empty()) return;
  const bool biased = experts[0].has_biases();
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& w = experts[e];
    const bool b1 = w.b1.defined(), b2 = w.b2.defined(), b3 = w.b3.defined();
    auto has = [](bool v) { return v ? "yes" : "no"; };
    MOEPEAK_CHECK(b1 == biased && b2 == biased && b3 == biased, who, ": expert ", e,
                  " has biases b1 ", has(b1), ", b2 ", has(b2), ", b3 ", has(b3),
                  " where expert 0 has ", biased ? "all three" : "none",
                  " (all three on every expert, or none)");
    if (!biased) continue;
    const int64_t F = w.w1.size(0), H = w.w1.size(1);
    const std::string at = std::string(who) + ": expert " + std::to_string(e) + " ";
    w.b1.expect(Shape{F}, w.w1.dtype(), at + "b1 (F, w1's dtype)");
    w.b3.expect(Shape{F}, w.w1.dtype(), at + "b3 (F, w1's dtype)");
    w.b2.expect(Shape{H}, w.w1.dtype(), at + "b2 (H, w1's dtype)");
    // The gradients' dtypes are the ops' to check (ops/bias.h: the weights' or fp32 beside bf16).
    for (const auto& [db, n, name] : {std::tuple{&w.db1, F, "db1"}, std::tuple{&w.db3, F, "db3"},
                                      std::tuple{&w.db2, H, "db2"}}) {
      MOEPEAK_CHECK(!db->defined() || db->shape() == Shape{n}, at, name, " must be (", n, "), got ",
                    db->str());
    }
  }
}

namespace {

// One weight (or gradient) of every expert, in expert order, as grouped_linear takes them.
std::vector<Tensor> each_expert(const std::vector<ExpertWeights>& experts,
                                Tensor ExpertWeights::*member) {
  std::vector<Tensor> out;
  out.reserve(experts.size());
  for (const ExpertWeights& ex : experts) out.push_back(ex.*member);
  return out;
}

// Whether the experts carry biases (all alike: check_expert_biases).
bool biased(const std::vector<ExpertWeights>& experts) {
  return !experts.empty() && experts[0].has_biases();
}

}  // namespace

void all_experts_forward(const std::vector<ExpertWeights>& experts,
                         const std::vector<int64_t>& offsets, const ops::SwigluParams& activation,
                         const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& g,
                         const Tensor& y, Stream& stream) {
  const std::vector<Tensor> w1 = each_expert(experts, &ExpertWeights::w1);
  const std::vector<Tensor> w3 = each_expert(experts, &ExpertWeights::w3);
  const std::vector<Tensor> w2 = each_expert(experts, &ExpertWeights::w2);
  // With biases each projection starts from its bias and the GEMM accumulates onto it.
  const bool bias = biased(experts);
  if (bias) {
    ops::grouped_bias_broadcast(each_expert(experts, &ExpertWeights::b1), offsets, a, stream);
    ops::grouped_bias_broadcast(each_expert(experts, &ExpertWeights::b3), offsets, b, stream);
  }
  ops::grouped_linear_forward(x, w1, offsets, a, bias, stream);
  ops::grouped_linear_forward(x, w3, offsets, b, bias, stream);
  ops::swiglu_forward(a, b, activation, g, stream);  // the plain op for the default (bitwise)
  if (bias) {
    ops::grouped_bias_broadcast(each_expert(experts, &ExpertWeights::b2), offsets, y, stream);
  }
  ops::grouped_linear_forward(g, w2, offsets, y, bias, stream);
}

void all_experts_backward(const std::vector<ExpertWeights>& experts,
                          const std::vector<int64_t>& offsets, const ops::SwigluParams& activation,
                          const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& dy,
                          const Tensor& g, const Tensor& dg, const Tensor& da, const Tensor& db,
                          const Tensor& dx, Stream& stream) {
  const std::vector<Tensor> w1 = each_expert(experts, &ExpertWeights::w1);
  const std::vector<Tensor> w3 = each_expert(experts, &ExpertWeights::w3);
  const std::vector<Tensor> w2 = each_expert(experts, &ExpertWeights::w2);
  const std::vector<Tensor> dw1 = each_expert(experts, &ExpertWeights::dw1);
  const std::vector<Tensor> dw3 = each_expert(experts, &ExpertWeights::dw3);
  const std::vector<Tensor> dw2 = each_expert(experts, &ExpertWeights::dw2);
  const bool bias = biased(experts);
  ops::swiglu_forward(a, b, activation, g, stream);
  if (bias)
    ops::grouped_bias_backward(dy, offsets, each_expert(experts, &ExpertWeights::db2), stream);
  ops::grouped_linear_backward(g, w2, offsets, dy, dg, false, dw2, stream);
  ops::swiglu_backward(a, b, dg, activation, da, db, stream);
  if (bias) {
    ops::grouped_bias_backward(da, offsets, each_expert(experts, &ExpertWeights::db1), stream);
    ops::grouped_bias_backward(db, offsets, each_expert(experts, &ExpertWeights::db3), stream);
  }
  ops::grouped_linear_backward(x, w1, offsets, da, dx, false, dw1, stream);
  ops::grouped_linear_backward(x, w3, offsets, db, dx, true, dw3, stream);
}

StandardDispatch::StandardDispatch(Backend& backend, Stream& stream, DType dtype,
                                   const ops::SwigluParams& activation)
    : backend_(backend), stream_(stream), dtype_(dtype), activation_(activation) {
  ops::check_swiglu_params("standard dispatch", activation);
}

void StandardDispatch::forward(const Tensor& x, const Tensor& index, const Tensor& weight,
                               const std::vector<ExpertWeights>& experts, const Tensor& out) {
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1);
  const int64_t E = static_cast<int64_t>(experts.size());
  const int64_t F = experts.at(0).w1.size(0);
  MOEPEAK_CHECK(index.size(0) == N && weight.size(0) == N && weight.size(1) == k,
                "dispatch: index ", index.str(), " and weight ", weight.str(), " for x ", x.str());
  check_expert_biases(experts, "dispatch");
  tokens_ = N;
  top_k_ = k;

  // Routing decisions to the host (the standard schedule sizes its buffers by them).
  std::vector<int32_t> host_index(static_cast<size_t>(N * k));
  backend_.copy_async(host_index.data(), index.data(), host_index.size() * 4,
                      CopyKind::device_to_host, stream_);
  stream_.synchronize();
  counts_.assign(static_cast<size_t>(E), 0);
  for (int32_t e : host_index) {
    MOEPEAK_CHECK(e >= 0 && e < E, "dispatch: expert index ", e, " out of range [0, ", E, ")");
    ++counts_[static_cast<size_t>(e)];
  }
  offsets_.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets_[e + 1] = offsets_[e] + counts_[e];
  const int64_t M = N * k;

  // Rows in expert order, tokens in order inside each expert.
  std::vector<int32_t> token(static_cast<size_t>(M)), slot(static_cast<size_t>(M));
  std::vector<int64_t> fill_at(offsets_.begin(), offsets_.end() - 1);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      int64_t row = fill_at[host_index[n * k + j]]++;
      token[row] = static_cast<int32_t>(n);
      slot[row] = static_cast<int32_t>(n * k + j);
    }
  }
  row_token_ = OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "row token");
  row_slot_ = OwnedTensor::device(backend_, Shape{M}, DType::i32, LiveSet::dispatch, "row slot");
  row_weight_ = OwnedTensor::device(backend_, Shape{M}, dtype_, LiveSet::dispatch, "row weight");
  backend_.copy_async(row_token_.data(), token.data(), M * 4, CopyKind::host_to_device, stream_);
  backend_.copy_async(row_slot_.data(), slot.data(), M * 4, CopyKind::host_to_device, stream_);
  // Row weights: gather the (N*k) weights by slot.
  ops::gather_rows(weight.reshape(Shape{N * k, 1}), row_slot_,
                   row_weight_.view().reshape(Shape{M, 1}), stream_);

  x_rows_ =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "dispatched rows");
  a_ = OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "expert w1 rows");
  b_ = OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "expert w3 rows");
  y_rows_ = OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "expert outputs");
  ops::gather_rows(x, row_token_, x_rows_, stream_);
  {
    OwnedTensor g = OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "swiglu");
    all_experts_forward(experts, offsets_, activation_, x_rows_, a_, b_, g, y_rows_, stream_);
  }
  ops::combine_rows(y_rows_, row_token_, row_weight_, out, stream_);
  // `token`, `slot` are read by the copies above: finish them before the vectors die.
  stream_.synchronize();
}

void StandardDispatch::backward(const Tensor& dout, const std::vector<ExpertWeights>& experts,
                                const Tensor& dx, const Tensor& dweight) {
  MOEPEAK_CHECK(x_rows_.view().defined(), "dispatch backward without a forward to go with it");
  const int64_t M = tokens_ * top_k_, H = dout.size(1), F = a_.shape()[1];
  check_expert_biases(experts, "dispatch backward");
  OwnedTensor dy =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "d expert outputs");
  OwnedTensor drow_weight =
      OwnedTensor::device(backend_, Shape{M}, dtype_, LiveSet::dispatch, "d row weight");
  ops::combine_rows_backward(dout, y_rows_, row_token_, row_weight_, dy, drow_weight, stream_);
  y_rows_.reset();
  OwnedTensor dx_rows =
      OwnedTensor::device(backend_, Shape{M, H}, dtype_, LiveSet::dispatch, "d dispatched rows");
  {
    OwnedTensor g = OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "swiglu");
    OwnedTensor dg =
        OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "d swiglu");
    OwnedTensor da =
        OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "d w1 rows");
    OwnedTensor db =
        OwnedTensor::device(backend_, Shape{M, F}, dtype_, LiveSet::dispatch, "d w3 rows");
    all_experts_backward(experts, offsets_, activation_, x_rows_, a_, b_, dy, g, dg, da, db,
                         dx_rows, stream_);
  }
  ops::scatter_add_rows(dx_rows, row_token_, dx, stream_);
  ops::fill(dweight, 0.0, stream_);
  ops::scatter_add_rows(drow_weight.view().reshape(Shape{M, 1}), row_slot_,
                        dweight.reshape(Shape{tokens_ * top_k_, 1}), stream_);
  release();
}

void StandardDispatch::release() {
  row_token_.reset();
  row_slot_.reset();
  row_weight_.reset();
  x_rows_.reset();
  a_.reset();
  b_.reset();
  y_rows_.reset();
}

}  // namespace moepeak::schedules
