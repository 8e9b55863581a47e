#include "core/model/mixtral.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/fill.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/router.h"

namespace moepeak {

// What one layer keeps from its forward for its backward.
struct MixtralModel::LayerActivations {
  OwnedTensor n1, rstd1;        // input norm (N, H), (N)
  OwnedTensor q, k, v;          // (N, nh*d), (N, nkv*d) x2, after RoPE
  OwnedTensor attn, lse;        // (N, nh*d), (B, nh, T)
  OwnedTensor h;                // (N, H) x + o_proj(attn)
  OwnedTensor n2, rstd2;        // post-attention norm (N, H), (N)
  OwnedTensor probs, topk_index, topk_weight;  // (N, E), (N, k) i32, (N, k)
  std::unique_ptr<schedules::StandardDispatch> dispatch;

  void release() {
    for (OwnedTensor* t : {&n1, &rstd1, &q, &k, &v, &attn, &lse, &h, &n2, &rstd2, &probs,
                           &topk_index, &topk_weight}) {
      t->reset();
    }
    if (dispatch) dispatch->release();
  }
};

namespace {
// The sizes a decoder layer works with: tokens N = B*T, hidden H, heads nh/nkv of d, experts E
// (top-k).
struct LayerDims {
  int64_t N, H, B, T, nh, nkv, d, E, k;
};
}  // namespace

MixtralModel::MixtralModel(Backend& backend, Stream& stream, const ModelConfig& model,
                           CheckpointSchedule checkpoint, DType dtype)
    : backend_(backend), stream_(stream), model_(model), checkpoint_(checkpoint), dtype_(dtype),
      params_(backend, model, dtype) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64, "the CPU model computes in f32 or f64, not ",
                dtype_name(dtype));
  MOEPEAK_CHECK(checkpoint != CheckpointSchedule::sco,
                "schedules.checkpoint = \"sco\" is not available in this version; use \"standard\" or \"none\"");
}

MixtralModel::~MixtralModel() = default;

OwnedTensor MixtralModel::device(Shape shape, LiveSet set, const char* what) const {
  return OwnedTensor::device(backend_, shape, dtype_, set, what);
}

static LayerDims layer_dims_of(const ModelConfig& m, const Tensor& x, const TokenBatch& batch) {
  return {x.size(0),           m.hidden_size,         batch.batch,
          batch.seq_len,       m.num_attention_heads, m.num_key_value_heads,
          m.head_dim_resolved(), m.num_local_experts, m.num_experts_per_tok};
}

std::vector<schedules::ExpertWeights> MixtralModel::experts_of(int layer) const {
  const LayerParamIndex& L = params_.layout().layers[layer];
  std::vector<schedules::ExpertWeights> experts;
  for (size_t j = 0; j < L.w1.size(); ++j) {
    experts.push_back({params_.value(L.w1[j]), params_.value(L.w2[j]), params_.value(L.w3[j]),
                       params_.grad(L.w1[j]), params_.grad(L.w2[j]), params_.grad(L.w3[j])});
  }
  return experts;
}

OwnedTensor MixtralModel::layer_forward(int layer, const Tensor& x, const TokenBatch& batch,
                                        LayerActivations& a, bool recompute) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const auto [N, H, B, T, nh, nkv, d, E, k] = layer_dims_of(model_, x, batch);
  auto w = [&](int i) { return params_.value(i); };

  // Attention block: n1 = norm(x); q, k, v; RoPE; causal GQA attention; h = x + o_proj(attn).
  a.n1 = device(Shape{N, H}, LiveSet::attention, "input norm");
  a.rstd1 = device(Shape{N}, LiveSet::attention, "input norm rstd");
  ops::rmsnorm_forward_cpu(x, w(L.input_norm), model_.rms_norm_eps, a.n1, a.rstd1, stream_);
  a.q = device(Shape{N, nh * d}, LiveSet::attention, "q");
  a.k = device(Shape{N, nkv * d}, LiveSet::attention, "k");
  a.v = device(Shape{N, nkv * d}, LiveSet::attention, "v");
  ops::linear_forward_cpu(a.n1, w(L.q), a.q, false, stream_);
  ops::linear_forward_cpu(a.n1, w(L.k), a.k, false, stream_);
  ops::linear_forward_cpu(a.n1, w(L.v), a.v, false, stream_);
  ops::rope_forward_cpu(a.q.view().reshape(Shape{N, nh, d}), batch.positions, model_.rope_theta, stream_);
  ops::rope_forward_cpu(a.k.view().reshape(Shape{N, nkv, d}), batch.positions, model_.rope_theta, stream_);
  a.attn = device(Shape{N, nh * d}, LiveSet::attention, "attention output");
  a.lse = device(Shape{B, nh, T}, LiveSet::attention, "attention lse");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ops::attention_forward_cpu(a.q.view().reshape(Shape{B, T, nh, d}),
                             a.k.view().reshape(Shape{B, T, nkv, d}),
                             a.v.view().reshape(Shape{B, T, nkv, d}), scale,
                             a.attn.view().reshape(Shape{B, T, nh, d}), a.lse, stream_);
  a.h = device(Shape{N, H}, LiveSet::workspace, "attention residual");
  ops::linear_forward_cpu(a.attn, w(L.o), a.h, false, stream_);
  ops::add_cpu(a.h, x, a.h, stream_);

  // MoE block: n2 = norm(h); router; y = h + sum of weighted experts.
  a.n2 = device(Shape{N, H}, LiveSet::workspace, "post-attention norm");
  a.rstd2 = device(Shape{N}, LiveSet::workspace, "post-attention norm rstd");
  ops::rmsnorm_forward_cpu(a.h, w(L.post_norm), model_.rms_norm_eps, a.n2, a.rstd2, stream_);
  a.probs = device(Shape{N, E}, LiveSet::workspace, "router probabilities");
  a.topk_index = OwnedTensor::device(backend_, Shape{N, k}, DType::i32, LiveSet::workspace, "top-k experts");
  a.topk_weight = device(Shape{N, k}, LiveSet::workspace, "top-k weights");
  {
    OwnedTensor router_logits = device(Shape{N, E}, LiveSet::workspace, "router logits");
    ops::linear_forward_cpu(a.n2, w(L.gate), router_logits, false, stream_);
    ops::router_forward_cpu(router_logits, static_cast<int>(k), a.probs, a.topk_index,
                            a.topk_weight, stream_);
  }
  OwnedTensor y = device(Shape{N, H}, LiveSet::boundaries, "layer output");
  ops::copy_cpu(a.h, y, stream_);
  if (!a.dispatch) a.dispatch = std::make_unique<schedules::StandardDispatch>(backend_, stream_, dtype_);
  a.dispatch->forward(a.n2, a.topk_index, a.topk_weight, experts_of(layer), y);
  if (!recompute) {
    expert_load_[layer] = a.dispatch->expert_counts();
    if (model_.router_aux_loss_coef != 0.0) accumulate_router_prob_sums(a.probs);
  }
  return y;
}

OwnedTensor MixtralModel::layer_backward(int layer, const Tensor& dy, const Tensor& x,
                                         const TokenBatch& batch, LayerActivations& a) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const auto [N, H, B, T, nh, nkv, d, E, k] = layer_dims_of(model_, x, batch);
  auto w = [&](int i) { return params_.value(i); };
  auto g = [&](int i) { return params_.grad(i); };

  // MoE block: dh = dy (residual) + norm backward of (experts' and router's dn2).
  OwnedTensor dn2 = device(Shape{N, H}, LiveSet::workspace, "d post-attention norm");
  ops::fill(dn2, 0.0, stream_);
  {
    OwnedTensor dtopk_weight = device(Shape{N, k}, LiveSet::workspace, "d top-k weights");
    a.dispatch->backward(dy, experts_of(layer), dn2, dtopk_weight);
    OwnedTensor drouter = device(Shape{N, E}, LiveSet::workspace, "d router logits");
    ops::router_backward_cpu(a.probs, a.topk_index, a.topk_weight, dtopk_weight, drouter, stream_);
    if (aux_dprobs_.view().defined()) ops::router_aux_backward_cpu(a.probs, aux_dprobs_, drouter, stream_);
    ops::linear_backward_cpu(a.n2, w(L.gate), drouter, dn2, true, g(L.gate), stream_);
  }
  OwnedTensor dh = device(Shape{N, H}, LiveSet::workspace, "d attention residual");
  ops::rmsnorm_backward_cpu(a.h, w(L.post_norm), a.rstd2, dn2, dh, g(L.post_norm), stream_);
  dn2.reset();
  ops::add_cpu(dh, dy, dh, stream_);

  // Attention block.
  OwnedTensor dattn = device(Shape{N, nh * d}, LiveSet::workspace, "d attention output");
  ops::linear_backward_cpu(a.attn, w(L.o), dh, dattn, false, g(L.o), stream_);
  OwnedTensor dq = device(Shape{N, nh * d}, LiveSet::workspace, "dq");
  OwnedTensor dk = device(Shape{N, nkv * d}, LiveSet::workspace, "dk");
  OwnedTensor dv = device(Shape{N, nkv * d}, LiveSet::workspace, "dv");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ops::attention_backward_cpu(
      a.q.view().reshape(Shape{B, T, nh, d}), a.k.view().reshape(Shape{B, T, nkv, d}),
      a.v.view().reshape(Shape{B, T, nkv, d}), a.attn.view().reshape(Shape{B, T, nh, d}), a.lse,
      dattn.view().reshape(Shape{B, T, nh, d}), scale, dq.view().reshape(Shape{B, T, nh, d}),
      dk.view().reshape(Shape{B, T, nkv, d}), dv.view().reshape(Shape{B, T, nkv, d}), stream_);
  dattn.reset();
  ops::rope_backward_cpu(dq.view().reshape(Shape{N, nh, d}), batch.positions, model_.rope_theta, stream_);
  ops::rope_backward_cpu(dk.view().reshape(Shape{N, nkv, d}), batch.positions, model_.rope_theta, stream_);
  OwnedTensor dn1 = device(Shape{N, H}, LiveSet::workspace, "d input norm");
  ops::linear_backward_cpu(a.n1, w(L.q), dq, dn1, false, g(L.q), stream_);
  ops::linear_backward_cpu(a.n1, w(L.k), dk, dn1, true, g(L.k), stream_);
  ops::linear_backward_cpu(a.n1, w(L.v), dv, dn1, true, g(L.v), stream_);
  OwnedTensor dx = device(Shape{N, H}, LiveSet::workspace, "d layer input");
  ops::rmsnorm_backward_cpu(x, w(L.input_norm), a.rstd1, dn1, dx, g(L.input_norm), stream_);
  ops::add_cpu(dx, dh, dx, stream_);
  a.release();
  return dx;
}

double MixtralModel::run(const TokenBatch& batch, int64_t loss_tokens, bool with_backward) {
  const int64_t N = batch.batch * batch.seq_len, H = model_.hidden_size;
  const int Lc = static_cast<int>(model_.num_hidden_layers);
  MOEPEAK_CHECK(batch.input_ids.numel() == N && batch.labels.numel() == N &&
                    batch.positions.numel() == N,
                "batch of ", batch.batch, " x ", batch.seq_len, " tokens with input_ids ",
                batch.input_ids.str(), ", labels ", batch.labels.str(), ", positions ",
                batch.positions.str());
  MOEPEAK_CHECK(loss_tokens > 0, "a batch with no scored tokens (every label is -100)");
  const ParamLayout& P = params_.layout();
  expert_load_.assign(static_cast<size_t>(Lc), {});
  router_prob_sums_.assign(static_cast<size_t>(model_.num_local_experts), 0.0);

  // inputs[l] is layer l's input (the checkpoint boundary); inputs[L] feeds the final norm.
  std::vector<OwnedTensor> inputs(static_cast<size_t>(Lc) + 1);
  std::vector<LayerActivations> acts(static_cast<size_t>(Lc));
  inputs[0] = device(Shape{N, H}, LiveSet::boundaries, "embedding output");
  ops::embedding_forward_cpu(batch.input_ids, params_.value(P.embed), inputs[0], stream_);
  for (int l = 0; l < Lc; ++l) {
    inputs[l + 1] = layer_forward(l, inputs[l], batch, acts[l], false);
    if (checkpoint_ == CheckpointSchedule::standard || !with_backward) acts[l].release();
    if (!with_backward) inputs[l].reset();
  }

  OwnedTensor xf = device(Shape{N, H}, LiveSet::workspace, "final norm");
  OwnedTensor rstdf = device(Shape{N}, LiveSet::workspace, "final norm rstd");
  ops::rmsnorm_forward_cpu(inputs[Lc], params_.value(P.final_norm), model_.rms_norm_eps, xf, rstdf,
                           stream_);
  schedules::MaterializedVocab vocab(backend_, stream_, dtype_);
  double loss = vocab.forward(xf, params_.value(P.lm_head), batch.labels,
                              1.0 / static_cast<double>(loss_tokens));
  if (model_.router_aux_loss_coef != 0.0) loss += router_aux_loss(N, with_backward);
  if (!with_backward) return loss;

  OwnedTensor dxf = device(Shape{N, H}, LiveSet::workspace, "d final norm");
  vocab.backward(xf, params_.value(P.lm_head), dxf, params_.grad(P.lm_head));
  OwnedTensor dx = device(Shape{N, H}, LiveSet::workspace, "d final hidden");
  ops::rmsnorm_backward_cpu(inputs[Lc], params_.value(P.final_norm), rstdf, dxf, dx,
                            params_.grad(P.final_norm), stream_);
  xf.reset();
  dxf.reset();
  inputs[Lc].reset();
  for (int l = Lc - 1; l >= 0; --l) {
    if (checkpoint_ == CheckpointSchedule::standard) {
      layer_forward(l, inputs[l], batch, acts[l], true);  // recompute; the output is dropped
    }
    dx = layer_backward(l, dx, inputs[l], batch, acts[l]);
    if (l > 0) inputs[l].reset();
  }
  ops::embedding_backward_cpu(batch.input_ids, dx, params_.grad(P.embed), stream_);
  stream_.synchronize();
  aux_dprobs_.reset();
  return loss;
}

void MixtralModel::accumulate_router_prob_sums(const Tensor& probs) {
  const int64_t N = probs.size(0), E = probs.size(1);
  const std::vector<double> host = copy_to_host_as_double(probs, backend_, stream_);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) router_prob_sums_[e] += host[n * E + e];
  }
}

double MixtralModel::router_aux_loss(int64_t tokens, bool with_backward) {
  // Mixtral's load_balancing_loss_func over all layers' router rows (R = tokens x layers):
  //   aux = E * sum_e (c_e / R) * (S_e / R),  c_e = routed (token, slot) pairs to e, S_e = sum of
  //   probs[., e]; d aux / d probs[row, e] = E * c_e / R^2 for every row of every layer.
  const int64_t E = model_.num_local_experts;
  const double R = static_cast<double>(tokens * model_.num_hidden_layers);
  std::vector<double> counts(static_cast<size_t>(E), 0.0);
  for (const auto& layer : expert_load_) {
    for (int64_t e = 0; e < E; ++e) counts[e] += static_cast<double>(layer[e]);
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (counts[e] / R) * (router_prob_sums_[e] / R);
  aux *= static_cast<double>(E);
  if (with_backward) {
    aux_dprobs_ = device(Shape{E}, LiveSet::workspace, "aux loss d probs");
    std::vector<char> host(aux_dprobs_.nbytes());
    for (int64_t e = 0; e < E; ++e) {
      double g = model_.router_aux_loss_coef * static_cast<double>(E) * counts[e] / (R * R);
      if (dtype_ == DType::f64) reinterpret_cast<double*>(host.data())[e] = g;
      else reinterpret_cast<float*>(host.data())[e] = static_cast<float>(g);
    }
    backend_.copy_async(aux_dprobs_.data(), host.data(), host.size(), CopyKind::host_to_device, stream_);
    stream_.synchronize();
  }
  return model_.router_aux_loss_coef * aux;
}

double MixtralModel::forward_backward(const TokenBatch& batch, int64_t loss_tokens) {
  return run(batch, loss_tokens, true);
}

double MixtralModel::forward_loss(const TokenBatch& batch, int64_t loss_tokens) {
  return run(batch, loss_tokens, false);
}

}  // namespace moepeak
