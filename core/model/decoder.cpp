// DecoderModel: the decoder's forward and backward on W ranks (see decoder.h for the layout).
#include "core/model/decoder.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/model/decoder_activations.h"
#include "core/model/layout_defect.h"
#include "ops/attention.h"
#include "ops/bias.h"
#include "ops/convert.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/fill.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/router.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/dispatch_choice.h"
#include "ops/schedules/vocab_choice.h"
#include "ops/swiglu.h"

namespace moepeak {

using schedules::HeadKind;

namespace {
SchedulesConfig with_checkpoint(CheckpointSchedule checkpoint) {
  SchedulesConfig s;
  s.checkpoint = checkpoint;
  return s;
}

// The experts' SwiGLU as the op takes it (ops/swiglu.h): plain, or gpt-oss's clamped form.
ops::SwigluParams expert_activation(const MlpSpec& mlp) {
  if (mlp.activation == ExpertActivation::swiglu) return {};
  return ops::SwigluParams::gpt_oss(mlp.swiglu_limit, mlp.swiglu_alpha);
}

}  // namespace

DecoderModel::DecoderModel(Backend& backend, Stream& stream, Comm& comm, const ModelConfig& model,
                           CheckpointSchedule checkpoint, DType dtype)
    : DecoderModel(backend, stream, comm, model, with_checkpoint(checkpoint), dtype) {}

DecoderModel::DecoderModel(Backend& backend, Stream& stream, Comm& comm, const ModelConfig& model,
                           const SchedulesConfig& schedules, DType dtype,
                           std::optional<ParallelDegrees> degrees, int zero_prefetch_depth)
    : backend_(backend),
      stream_(stream),
      comm_(comm),
      model_(model),
      schedules_(schedules),
      checkpoint_(schedules.checkpoint),
      dtype_(dtype),
      layout_(comm, degrees.value_or(ParallelDegrees::uniform(comm.world_size())), backend.kind()),
      params_(backend, model, dtype, layout_, lm_head_sharding(schedules.vocab)),
      spec_(params_.layout().spec()),
      // One rank gathers nothing: no comm stream for it.
      zero_traffic_(params_, backend, stream, comm.world_size() > 1 ? zero_prefetch_depth : 0) {
  const auto [first, last] = zero_local_experts(model, layout_.degrees(), layout_.expert().rank());
  groups_ = zero_gather_groups(params_.layout(), params_.lm_head_sharding(), first, last);
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                "the model computes in f32, bf16 or f64, not ", dtype_name(dtype));
  boundaries_ = schedules::make_boundaries(schedules_, backend_, stream_);
  // Collective under ring_dtp (RingDtpVocab duplicates the communicator).
  vocab_ = schedules::make_vocab(schedules_, backend_, stream_, comm_, dtype_, model_.vocab_size);
}

DecoderModel::~DecoderModel() = default;

void DecoderModel::check_layout(const ModelConfig& model, int64_t batch, int64_t seq_len,
                                const ParallelDegrees& d) {
  std::string why;
  if (layout_defect(model, batch, seq_len, d, &why) != LayoutDefect::none) {
    MOEPEAK_INPUT_ERROR(why);
  }
}

OwnedTensor DecoderModel::device(Shape shape, LiveSet set, const char* what) const {
  return OwnedTensor::device(backend_, shape, dtype_, set, what);
}

void DecoderModel::enter(StepPhase phase) const { backend_.arena().set_phase(phase); }

std::vector<schedules::ExpertWeights> DecoderModel::local_experts_of(int layer, const Group& w,
                                                                     bool with_grads) const {
  const LayerParamIndex& L = params_.layout().layers[layer];
  std::vector<schedules::ExpertWeights> experts;
  for (size_t j = 0; j < L.w1.size(); ++j) {
    if (!params_.is_local(L.w1[j])) continue;
    schedules::ExpertWeights e{w.value(L.w1[j]), w.value(L.w2[j]), w.value(L.w3[j]), {}, {}, {}};
    if (with_grads) {
      e.dw1 = w.grad(L.w1[j]);
      e.dw2 = w.grad(L.w2[j]);
      e.dw3 = w.grad(L.w3[j]);
    }
    if (!L.b1.empty()) {
      e.b1 = w.value(L.b1[j]);
      e.b2 = w.value(L.b2[j]);
      e.b3 = w.value(L.b3[j]);
      if (with_grads) {
        e.db1 = w.grad(L.b1[j]);
        e.db2 = w.grad(L.b2[j]);
        e.db3 = w.grad(L.b3[j]);
      }
    }
    experts.push_back(e);
  }
  return experts;
}

ops::GroupLimitedRouting DecoderModel::group_limited_routing(int layer, const Group& w,
                                                             OwnedTensor& bias_f32) const {
  const RouterSpec& r = spec_.layers[layer].mlp.router;
  if (r.score != RouterScore::sigmoid_group_limited) return {};
  ops::GroupLimitedRouting routing{r.groups, r.topk_groups, Tensor(), r.scaling};
  const int bias = params_.layout().layers[layer].router_correction_bias;
  if (bias >= 0) {
    routing.correction_bias = w.value(bias);
    if (dtype_ == DType::bf16) {
      // NOTES: the op adds an fp32 bias (transformers keeps e_score_correction_bias in fp32); a
      // bf16 model's bias is its working weight, widened here (its fp32 master is the
      // optimizer's, which the balancing moves: core/train/router_balance.h).
      bias_f32 = OwnedTensor::device(backend_, w.value(bias).shape(), DType::f32,
                                     LiveSet::workspace, "router correction bias (fp32)");
      ops::convert(w.value(bias), bias_f32, stream_);
      routing.correction_bias = bias_f32.view();
    }
  }
  return routing;
}

void DecoderModel::project(const Tensor& x, const Group& w, int weight, int bias,
                           const Tensor& y) const {
  if (bias >= 0) ops::bias_broadcast(w.value(bias), y, stream_);
  ops::linear_forward(x, w.value(weight), y, /*accumulate=*/bias >= 0, stream_);
}

ops::AttentionVariant DecoderModel::attention_variant(int layer, const Group& w,
                                                      const TokenBatch& batch) const {
  const LayerParamIndex& L = params_.layout().layers[layer];
  ops::AttentionVariant variant;
  variant.window = spec_.layers[layer].attention.window;
  variant.doc_start = batch.doc_start;
  if (L.sinks >= 0) {
    const auto [first, last] = ulysses_.q_heads_of(static_cast<int>(ulysses_.rank));
    variant.sinks = w.value(L.sinks).rows(first, last);
  }
  return variant;
}

OwnedTensor DecoderModel::attention_forward(int layer, const Group& w, const Tensor& x,
                                            const TokenBatch& batch, LayerActivations& a) {
  if (spec_.layers[layer].attention.latent())
    return latent_attention_forward(layer, w, x, batch, a);
  const LayerParamIndex& L = params_.layout().layers[layer];
  const schedules::UlyssesLayout& U = ulysses_;
  // B: the sequences of this rank's sequence group (all B when Sp = W).
  const int64_t N = x.size(0), H = model_.hidden_size, B = U.batch, T = batch.seq_len;
  const int64_t nh = model_.num_attention_heads, nkv = model_.num_key_value_heads;
  const int64_t d = model_.head_dim_resolved();
  Comm& sp = layout_.sequence();
  const bool exchange = sp.world_size() > 1;

  // n1 = norm(x); q, k, v of this rank's tokens; RoPE at their global positions.
  a.n1 = device(Shape{N, H}, LiveSet::attention, "input norm");
  a.rstd1 = device(Shape{N}, LiveSet::attention, "input norm rstd");
  ops::rmsnorm_forward(x, w.value(L.input_norm), spec_.norm_eps, a.n1, a.rstd1, stream_,
                       spec_.norm_order);
  OwnedTensor q = device(Shape{N, nh * d}, LiveSet::attention, "q");
  OwnedTensor k = device(Shape{N, nkv * d}, LiveSet::attention, "k");
  OwnedTensor v = device(Shape{N, nkv * d}, LiveSet::attention, "v");
  project(a.n1, w, L.q, L.q_bias, q);
  project(a.n1, w, L.k, L.k_bias, k);
  project(a.n1, w, L.v, L.v_bias, v);
  if (L.q_norm >= 0) {
    // An RMSNorm over head_dim on every query and key head (rows of d), before RoPE; the
    // projections themselves are kept for its backward.
    a.q_pre = std::move(q);
    a.k_pre = std::move(k);
    a.rstd_q = device(Shape{N * nh}, LiveSet::attention, "q norm rstd");
    a.rstd_k = device(Shape{N * nkv}, LiveSet::attention, "k norm rstd");
    q = device(Shape{N, nh * d}, LiveSet::attention, "q");
    k = device(Shape{N, nkv * d}, LiveSet::attention, "k");
    ops::rmsnorm_forward(a.q_pre.view().reshape(Shape{N * nh, d}), w.value(L.q_norm),
                         spec_.norm_eps, q.view().reshape(Shape{N * nh, d}), a.rstd_q, stream_,
                         spec_.norm_order);
    ops::rmsnorm_forward(a.k_pre.view().reshape(Shape{N * nkv, d}), w.value(L.k_norm),
                         spec_.norm_eps, k.view().reshape(Shape{N * nkv, d}), a.rstd_k, stream_,
                         spec_.norm_order);
  }
  ops::rope_forward(q.view().reshape(Shape{N, nh, d}), batch.positions, rope_, stream_);
  ops::rope_forward(k.view().reshape(Shape{N, nkv, d}), batch.positions, rope_, stream_);

  // To the head layout: whole sequences of this rank's heads.
  OwnedTensor staging;
  if (!exchange) {
    a.q = std::move(q);
    a.k = std::move(k);
    a.v = std::move(v);
  } else {
    staging = schedules::make_ulysses_staging(backend_, U, dtype_);
    auto to_heads = [&](const OwnedTensor& seq, HeadKind kind, const char* what) {
      OwnedTensor heads = device(U.heads_shape(kind), LiveSet::attention, what);
      schedules::seq_to_heads(seq.view().reshape(U.seq_shape(kind)), heads, kind, staging, U, sp,
                              stream_);
      return heads;
    };
    a.q = to_heads(q, HeadKind::query, "q (head layout)");
    a.k = to_heads(k, HeadKind::kv, "k (head layout)");
    a.v = to_heads(v, HeadKind::kv, "v (head layout)");
    q.reset();
    k.reset();
    v.reset();
  }
  const Shape q_heads = U.heads_shape(HeadKind::query), kv_heads = U.heads_shape(HeadKind::kv);
  a.out = device(Shape{N * nh * d}, LiveSet::attention, "attention output");
  a.lse = OwnedTensor::device(backend_, Shape{B, q_heads[2], T}, ops::attention_lse_dtype(dtype_),
                              LiveSet::attention, "attention lse");
  const double scale = spec_.layers[layer].attention.scale;
  ops::attention_forward(a.q.view().reshape(q_heads), a.k.view().reshape(kv_heads),
                         a.v.view().reshape(kv_heads), scale, attention_variant(layer, w, batch),
                         a.out.view().reshape(q_heads), a.lse, stream_);
  Tensor attn = a.out.view().reshape(Shape{N, nh * d});
  if (exchange) {
    a.attn = device(Shape{N, nh * d}, LiveSet::attention, "attention output (token layout)");
    schedules::heads_to_seq(a.out.view().reshape(q_heads),
                            a.attn.view().reshape(U.seq_shape(HeadKind::query)), HeadKind::query,
                            false, staging, U, sp, stream_);
    attn = a.attn.view();
  }
  OwnedTensor h = device(Shape{N, H}, LiveSet::workspace, "attention residual");
  project(attn, w, L.o, L.o_bias, h);
  ops::add(h, x, h, stream_);
  return h;
}

OwnedTensor DecoderModel::attention_backward(int layer, const Group& w, const Tensor& dh,
                                             const Tensor& x, const TokenBatch& batch,
                                             LayerActivations& a) {
  if (spec_.layers[layer].attention.latent())
    return latent_attention_backward(layer, w, dh, x, batch, a);
  const LayerParamIndex& L = params_.layout().layers[layer];
  const schedules::UlyssesLayout& U = ulysses_;
  const int64_t N = x.size(0), H = model_.hidden_size;
  const int64_t nh = model_.num_attention_heads, nkv = model_.num_key_value_heads;
  const int64_t d = model_.head_dim_resolved();
  Comm& sp = layout_.sequence();
  const bool exchange = sp.world_size() > 1;
  const Shape q_heads = U.heads_shape(HeadKind::query), kv_heads = U.heads_shape(HeadKind::kv);
  enter(StepPhase::backward_attention);

  Tensor attn = exchange ? a.attn.view() : a.out.view().reshape(Shape{N, nh * d});
  OwnedTensor dattn = device(Shape{N, nh * d}, LiveSet::workspace, "d attention output");
  ops::linear_backward(attn, w.value(L.o), dh, dattn, false, w.grad(L.o), stream_);
  if (L.o_bias >= 0) ops::bias_backward(dh, w.grad(L.o_bias), stream_);
  OwnedTensor staging, dout;
  if (exchange) {
    staging = schedules::make_ulysses_staging(backend_, U, dtype_);
    dout = device(q_heads, LiveSet::workspace, "d attention output (head layout)");
    schedules::seq_to_heads(dattn.view().reshape(U.seq_shape(HeadKind::query)), dout,
                            HeadKind::query, staging, U, sp, stream_);
    dattn.reset();
  } else {
    dout = std::move(dattn);
  }
  OwnedTensor dq = device(q_heads, LiveSet::workspace, "dq");
  OwnedTensor dk = device(kv_heads, LiveSet::workspace, "dk");
  OwnedTensor dv = device(kv_heads, LiveSet::workspace, "dv");
  const double scale = spec_.layers[layer].attention.scale;
  // NOTES: a rank adds the sinks' gradient of its own query heads only; the ZeRO-3 reduce-scatter
  // of the layer's gradients sums the sequence group's ranks, whose heads partition nh.
  const ops::AttentionVariant variant = attention_variant(layer, w, batch);
  Tensor dsinks;
  if (L.sinks >= 0) {
    const auto [first, last] = U.q_heads_of(static_cast<int>(U.rank));
    dsinks = w.grad(L.sinks).rows(first, last);
  }
  ops::attention_backward(a.q.view().reshape(q_heads), a.k.view().reshape(kv_heads),
                          a.v.view().reshape(kv_heads), a.out.view().reshape(q_heads), a.lse,
                          dout.view().reshape(q_heads), scale, variant, dq, dk, dv, dsinks,
                          stream_);
  dout.reset();
  if (exchange) {
    // Back to this rank's tokens; a kv head replicated on several ranks sums their gradients.
    auto to_tokens = [&](OwnedTensor& heads, HeadKind kind, int64_t width, const char* what) {
      OwnedTensor seq = device(Shape{N, width}, LiveSet::workspace, what);
      schedules::heads_to_seq(heads, seq.view().reshape(U.seq_shape(kind)), kind, true, staging, U,
                              sp, stream_);
      heads.reset();
      return seq;
    };
    dq = to_tokens(dq, HeadKind::query, nh * d, "dq (token layout)");
    dk = to_tokens(dk, HeadKind::kv, nkv * d, "dk (token layout)");
    dv = to_tokens(dv, HeadKind::kv, nkv * d, "dv (token layout)");
  }
  ops::rope_backward(dq.view().reshape(Shape{N, nh, d}), batch.positions, rope_, stream_);
  ops::rope_backward(dk.view().reshape(Shape{N, nkv, d}), batch.positions, rope_, stream_);
  if (L.q_norm >= 0) {
    // NOTES: in place (dx = dy): the norm's backward reads each row whole before it writes it
    // (ops/rmsnorm.h), so dq and dk become the projections' gradients without a second buffer.
    const Tensor dq_rows = dq.view().reshape(Shape{N * nh, d});
    const Tensor dk_rows = dk.view().reshape(Shape{N * nkv, d});
    ops::rmsnorm_backward(a.q_pre.view().reshape(Shape{N * nh, d}), w.value(L.q_norm), a.rstd_q,
                          dq_rows, dq_rows, w.grad(L.q_norm), stream_);
    ops::rmsnorm_backward(a.k_pre.view().reshape(Shape{N * nkv, d}), w.value(L.k_norm), a.rstd_k,
                          dk_rows, dk_rows, w.grad(L.k_norm), stream_);
  }
  if (L.q_bias >= 0) {
    ops::bias_backward(dq.view().reshape(Shape{N, nh * d}), w.grad(L.q_bias), stream_);
    ops::bias_backward(dk.view().reshape(Shape{N, nkv * d}), w.grad(L.k_bias), stream_);
    ops::bias_backward(dv.view().reshape(Shape{N, nkv * d}), w.grad(L.v_bias), stream_);
  }
  OwnedTensor dn1 = device(Shape{N, H}, LiveSet::workspace, "d input norm");
  ops::linear_backward(a.n1, w.value(L.q), dq.view().reshape(Shape{N, nh * d}), dn1, false,
                       w.grad(L.q), stream_);
  ops::linear_backward(a.n1, w.value(L.k), dk.view().reshape(Shape{N, nkv * d}), dn1, true,
                       w.grad(L.k), stream_);
  ops::linear_backward(a.n1, w.value(L.v), dv.view().reshape(Shape{N, nkv * d}), dn1, true,
                       w.grad(L.v), stream_);
  OwnedTensor dx = device(Shape{N, H}, LiveSet::workspace, "d layer input");
  ops::rmsnorm_backward(x, w.value(L.input_norm), a.rstd1, dn1, dx, w.grad(L.input_norm), stream_);
  ops::add(dx, dh, dx, stream_);
  return dx;
}

OwnedTensor DecoderModel::layer_forward(int layer, const Group& w, const Tensor& x,
                                        const TokenBatch& batch, LayerActivations& a,
                                        bool recompute) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const int64_t N = x.size(0), H = model_.hidden_size;

  enter(attention_phase(recompute));  // the recompute is part of the layer's backward
  a.h = attention_forward(layer, w, x, batch, a);
  enter(experts_phase(recompute));

  // MLP block: n2 = norm(h); y = h + mlp(n2).
  a.n2 = device(Shape{N, H}, LiveSet::workspace, "post-attention norm");
  a.rstd2 = device(Shape{N}, LiveSet::workspace, "post-attention norm rstd");
  ops::rmsnorm_forward(a.h, w.value(L.post_norm), spec_.norm_eps, a.n2, a.rstd2, stream_,
                       spec_.norm_order);
  return L.moe() ? moe_forward(layer, w, a, recompute) : dense_mlp_forward(L, w, a, recompute);
}

OwnedTensor DecoderModel::moe_forward(int layer, const Group& w, LayerActivations& a,
                                      bool recompute) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const MlpSpec& mlp = spec_.layers[layer].mlp;
  const int64_t N = a.n2.view().size(0), H = model_.hidden_size;
  const int64_t E = mlp.experts, k = mlp.router.top_k;
  a.probs = device(Shape{N, E}, LiveSet::workspace, "router probabilities");
  a.topk_index =
      OwnedTensor::device(backend_, Shape{N, k}, DType::i32, LiveSet::workspace, "top-k experts");
  a.topk_weight = device(Shape{N, k}, LiveSet::workspace, "top-k weights");
  {
    OwnedTensor router_logits = device(Shape{N, E}, LiveSet::workspace, "router logits");
    project(a.n2, w, L.router, L.router_bias, router_logits);
    OwnedTensor bias_f32;
    const ops::GroupLimitedRouting routing = group_limited_routing(layer, w, bias_f32);
    ops::router_forward(router_logits, static_cast<int>(k), mlp.router.score,
                        mlp.router.renormalize, a.probs, a.topk_index, a.topk_weight, stream_,
                        routing);
  }
  if (schedules_.routing == Routing::worst_case) {
    // The plan's worst case (schedules.routing): token n's j-th expert is expert j, so every
    // row lands on expert rank 0; the weights stay the router's.
    std::vector<double> index(static_cast<size_t>(N * k));
    for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<double>(i % k);
    copy_from_host_as(index, a.topk_index, backend_, stream_);
  }
  if (dispatchers_.size() <= static_cast<size_t>(layer))
    dispatchers_.resize(static_cast<size_t>(layer) + 1);
  if (!dispatchers_[layer]) {
    dispatchers_[layer] = schedules::make_dispatch(schedules_, backend_, stream_, layout_.expert(),
                                                   dtype_, E, llep_lane_, expert_activation(mlp));
  }
  a.dispatch = dispatchers_[layer].get();
  // The recompute's output is dropped: a dispatcher that can (PipelinedLLEP) then only plans (an
  // undefined `out`), as its backward recomputes the experts chunk by chunk anyway
  // (ExpertDispatch::forward), and the output is not even allocated (one boundary less beside
  // the backward's experts: BoundariesBytes::phases).
  const bool plan_only = recompute && a.dispatch->supports_plan_only();
  OwnedTensor y;
  if (!plan_only) {
    y = device(Shape{N, H}, LiveSet::boundaries, "layer output");
    ops::copy(a.h, y, stream_);
  }
  a.dispatch->forward(a.n2, a.topk_index, a.topk_weight, local_experts_of(layer, w, false),
                      plan_only ? Tensor() : y.view());
  if (L.shared_gate >= 0) shared_experts_forward(L, w, a, plan_only ? Tensor() : y.view());
  if (!recompute) {
    expert_load_[layer] = a.dispatch->expert_counts();  // over the expert group
    Comm& replicas = layout_.expert_replicas();
    if (replicas.world_size() > 1) {
      std::vector<double> counts(expert_load_[layer].begin(), expert_load_[layer].end());
      all_reduce_host(replicas, backend_, stream_, counts);
      for (size_t e = 0; e < counts.size(); ++e) {
        expert_load_[layer][e] = static_cast<int64_t>(counts[e]);
      }
    }
    if (spec_.aux_loss_coef != 0.0) {
      if (spec_.aux_loss_per_sequence) {
        accumulate_sequence_balance(layer, a);
      } else {
        accumulate_router_prob_sums(a.probs);
      }
    }
  }
  return y;
}

void DecoderModel::moe_backward(int layer, const Group& w, const Tensor& dy, LayerActivations& a,
                                const Tensor& dn2) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const MlpSpec& mlp = spec_.layers[layer].mlp;
  const int64_t N = dy.size(0), E = mlp.experts, k = mlp.router.top_k;
  OwnedTensor dtopk_weight = device(Shape{N, k}, LiveSet::workspace, "d top-k weights");
  a.dispatch->backward(dy, local_experts_of(layer, w, true), dn2, dtopk_weight);
  if (L.shared_gate >= 0) shared_experts_backward(L, w, dy, a, dn2);
  OwnedTensor drouter = device(Shape{N, E}, LiveSet::workspace, "d router logits");
  ops::router_backward(a.probs, a.topk_index, a.topk_weight, dtopk_weight, mlp.router.renormalize,
                       drouter, stream_, mlp.router.score,
                       ops::GroupLimitedRouting{1, 1, Tensor(), mlp.router.scaling});
  if (aux_dprobs_.view().defined())
    ops::router_aux_backward(a.probs, aux_dprobs_, drouter, stream_);
  if (spec_.aux_loss_per_sequence && spec_.aux_loss_coef != 0.0)
    sequence_balance_backward(layer, a, drouter);
  if (L.router_bias >= 0) ops::bias_backward(drouter, w.grad(L.router_bias), stream_);
  ops::linear_backward(a.n2, w.value(L.router), drouter, dn2, true, w.grad(L.router), stream_);
}

// One SwiGLU MLP's weights and their gradients: a dense layer's, or the shared experts'.
struct SwigluMlp {
  Tensor gate, up, down;     // (I, H), (I, H), (H, I)
  Tensor dgate, dup, ddown;  // their gradients (+=)
  const char* name;          // the activations' name (a literal): "dense MLP", "shared experts"
};

namespace {

SwigluMlp dense_mlp_of(const LayerParamIndex& L, const ZeroParamStore::GatheredGroup& w,
                       bool with_grads) {
  SwigluMlp m{
      w.value(L.dense_gate), w.value(L.dense_up), w.value(L.dense_down), {}, {}, {}, "dense MLP"};
  if (with_grads) {
    m.dgate = w.grad(L.dense_gate);
    m.dup = w.grad(L.dense_up);
    m.ddown = w.grad(L.dense_down);
  }
  return m;
}

SwigluMlp shared_experts_of(const LayerParamIndex& L, const ZeroParamStore::GatheredGroup& w,
                            bool with_grads) {
  SwigluMlp m{w.value(L.shared_gate), w.value(L.shared_up), w.value(L.shared_down), {}, {}, {},
              "shared experts"};
  if (with_grads) {
    m.dgate = w.grad(L.shared_gate);
    m.dup = w.grad(L.shared_up);
    m.ddown = w.grad(L.shared_down);
  }
  return m;
}

}  // namespace

// gate = n2 G^T and up = n2 U^T into the activations' (kept for the backward); unless y is
// undefined, y += down(silu(gate) * up).
void DecoderModel::swiglu_mlp_forward(const SwigluMlp& m, const Tensor& n2, OwnedTensor& gate,
                                      OwnedTensor& up, const Tensor& y) const {
  const int64_t N = n2.size(0), I = m.gate.size(0);
  gate = device(Shape{N, I}, LiveSet::workspace, m.name);
  up = device(Shape{N, I}, LiveSet::workspace, m.name);
  ops::linear_forward(n2, m.gate, gate, false, stream_);
  ops::linear_forward(n2, m.up, up, false, stream_);
  if (!y.defined()) return;
  OwnedTensor act = device(Shape{N, I}, LiveSet::workspace, m.name);
  ops::swiglu_forward(gate, up, act, stream_);
  ops::linear_forward(act, m.down, y, /*accumulate=*/true, stream_);
}

// dn2 += d/dn2 of y's term from dy; the weights' gradients +=.
void DecoderModel::swiglu_mlp_backward(const SwigluMlp& m, const Tensor& n2, const Tensor& gate,
                                       const Tensor& up, const Tensor& dy,
                                       const Tensor& dn2) const {
  const int64_t N = dy.size(0), I = gate.size(1);
  // The activation again from the kept gate and up (cheaper than keeping it), then down's
  // backward, SwiGLU's, and gate's and up's into dn2.
  OwnedTensor act = device(Shape{N, I}, LiveSet::workspace, m.name);
  ops::swiglu_forward(gate, up, act, stream_);
  OwnedTensor dact = device(Shape{N, I}, LiveSet::workspace, m.name);
  ops::linear_backward(act, m.down, dy, dact, false, m.ddown, stream_);
  act.reset();
  OwnedTensor dgate = device(Shape{N, I}, LiveSet::workspace, m.name);
  OwnedTensor dup = device(Shape{N, I}, LiveSet::workspace, m.name);
  ops::swiglu_backward(gate, up, dact, dgate, dup, stream_);
  dact.reset();
  ops::linear_backward(n2, m.gate, dgate, dn2, true, m.dgate, stream_);
  ops::linear_backward(n2, m.up, dup, dn2, true, m.dup, stream_);
}

OwnedTensor DecoderModel::dense_mlp_forward(const LayerParamIndex& L, const Group& w,
                                            LayerActivations& a, bool recompute) {
  const int64_t N = a.n2.view().size(0), H = model_.hidden_size;
  if (recompute) {  // the backward needs gate and up, not the output
    swiglu_mlp_forward(dense_mlp_of(L, w, false), a.n2, a.mlp_gate, a.mlp_up, Tensor());
    return OwnedTensor();
  }
  OwnedTensor y = device(Shape{N, H}, LiveSet::boundaries, "layer output");
  ops::copy(a.h, y, stream_);
  swiglu_mlp_forward(dense_mlp_of(L, w, false), a.n2, a.mlp_gate, a.mlp_up, y);
  return y;
}

void DecoderModel::dense_mlp_backward(const LayerParamIndex& L, const Group& w, const Tensor& dy,
                                      LayerActivations& a, const Tensor& dn2) {
  swiglu_mlp_backward(dense_mlp_of(L, w, true), a.n2, a.mlp_gate, a.mlp_up, dy, dn2);
}

void DecoderModel::shared_experts_forward(const LayerParamIndex& L, const Group& w,
                                          LayerActivations& a, const Tensor& y) {
  swiglu_mlp_forward(shared_experts_of(L, w, false), a.n2, a.shared_gate, a.shared_up, y);
}

void DecoderModel::shared_experts_backward(const LayerParamIndex& L, const Group& w,
                                           const Tensor& dy, LayerActivations& a,
                                           const Tensor& dn2) {
  swiglu_mlp_backward(shared_experts_of(L, w, true), a.n2, a.shared_gate, a.shared_up, dy, dn2);
}

OwnedTensor DecoderModel::layer_backward(int layer, const Group& w, const Tensor& dy,
                                         const Tensor& x, const TokenBatch& batch,
                                         LayerActivations& a) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const int64_t N = x.size(0), H = model_.hidden_size;

  enter(StepPhase::backward_experts);
  // MLP block: dh = dy (residual) + norm backward of the MLP's (experts' and router's) dn2.
  OwnedTensor dn2 = device(Shape{N, H}, LiveSet::workspace, "d post-attention norm");
  ops::fill(dn2, 0.0, stream_);
  if (L.moe()) {
    moe_backward(layer, w, dy, a, dn2);
  } else {
    dense_mlp_backward(L, w, dy, a, dn2);
  }
  OwnedTensor dh = device(Shape{N, H}, LiveSet::workspace, "d attention residual");
  ops::rmsnorm_backward(a.h, w.value(L.post_norm), a.rstd2, dn2, dh, w.grad(L.post_norm), stream_);
  dn2.reset();
  ops::add(dh, dy, dh, stream_);

  OwnedTensor dx = attention_backward(layer, w, dh, x, batch, a);
  a.release();
  return dx;
}

double DecoderModel::run(const TokenBatch& batch, int64_t loss_tokens, bool with_backward,
                         bool with_aux_loss) {
  const int W = comm_.world_size();
  const int64_t B = batch.batch, T = batch.seq_len, H = model_.hidden_size;
  const int Lc = static_cast<int>(model_.num_hidden_layers);
  const ParallelDegrees& degrees = layout_.degrees();
  check_layout(model_, B, T, degrees);
  const AttentionSpec& attention = spec_.layers.front().attention;  // every layer's dims
  ulysses_ = schedules::UlyssesLayout::make(B / degrees.sequence_groups(), T, degrees.sequence,
                                            layout_.sequence().rank(), attention.heads,
                                            attention.kv_heads, attention.head_dim);
  const int64_t N = ulysses_.local_tokens();
  // NOTES: positions are global and every sequence of a batch is T long, so T is the length
  // dynamic NTK scaling reads (transformers: the largest position + 1) on every rank alike.
  rope_ = spec_.rope.params(T);
  MOEPEAK_CHECK(
      batch.input_ids.numel() == N && batch.labels.numel() == N && batch.positions.numel() == N,
      "rank ", comm_.rank(), " of ", W, ": a batch of ", B, " x ", T, " tokens needs ", N,
      " tokens per rank, not input_ids ", batch.input_ids.str(), ", labels ", batch.labels.str(),
      ", positions ", batch.positions.str());
  MOEPEAK_CHECK(loss_tokens > 0, "a batch with no scored tokens (every label is -100)");
  expert_load_.assign(static_cast<size_t>(Lc), {});
  router_prob_sums_.assign(static_cast<size_t>(spec_.experts()), 0.0);
  sequence_aux_grad_.assign(static_cast<size_t>(Lc), {});
  sequence_aux_loss_ = 0;
  const ParamLayout& P = params_.layout();

  // The checkpoint boundaries — each layer's input, from its forward to its backward — live in
  // boundaries_ (standard: on device; SCO: some in pinned host memory, brought back one layer
  // ahead); `final_hidden`, the last layer's output, feeds the final norm.
  const bool recompute = schedules::recomputes_layers(checkpoint_);
  schedules::CheckpointBoundaries& boundaries = *boundaries_;
  boundaries.begin(Lc, Shape{N, H}, dtype_, with_backward);
  struct DiscardOnExit {  // after end() a no-op; after an error, no copy runs into freed bytes
    schedules::CheckpointBoundaries& b;
    ~DiscardOnExit() { b.discard(); }
  } discard_on_exit{boundaries};
  // The gathered groups in the order of zero_pass_uses (the planner's), their collectives on
  // ZeroTraffic's comm stream ahead of use (zero_prefetch_depth >= 1).
  ZeroTraffic& zero = zero_traffic_;
  zero.begin(groups_, zero_pass_uses(Lc, with_backward));
  struct AbandonOnExit {  // after end() a no-op; after an error, no collective outlives the pass
    ZeroTraffic& t;
    ~AbandonOnExit() {
      if (t.in_pass()) t.abandon();
    }
  } abandon_on_exit{zero};
  std::vector<LayerActivations> acts(static_cast<size_t>(Lc));
  Tensor x;  // (N, H) the current layer's input
  {
    enter(StepPhase::embedding);
    OwnedTensor embedded = device(Shape{N, H}, LiveSet::boundaries, "embedding output");
    Group embed = zero.acquire();
    ops::embedding_forward(batch.input_ids, embed.value(P.embed), embedded, stream_);
    zero.release(std::move(embed));
    x = boundaries.keep(0, std::move(embedded));
  }
  OwnedTensor final_hidden;
  for (int l = 0; l < Lc; ++l) {
    // Without checkpointing, backward reuses this forward's activations but gathers the weights
    // again; with it, backward recomputes the layer from its input under one backward gather.
    enter(StepPhase::forward_attention);  // the layer's gather is its pass's
    Group w = zero.acquire();
    OwnedTensor y = layer_forward(l, w, x, batch, acts[l], false);
    zero.release(std::move(w));
    if (recompute || !with_backward) acts[l].release();
    boundaries.forward_done(l);
    if (l + 1 < Lc) {
      x = boundaries.keep(l + 1, std::move(y));
    } else {
      final_hidden = std::move(y);
    }
  }

  enter(StepPhase::head);
  Group head = zero.acquire();  // with backward: values and grads (zero_pass_uses)
  OwnedTensor xf = device(Shape{N, H}, LiveSet::workspace, "final norm");
  OwnedTensor rstdf = device(Shape{N}, LiveSet::workspace, "final norm rstd");
  ops::rmsnorm_forward(final_hidden, head.value(P.final_norm), spec_.norm_eps, xf, rstdf, stream_,
                       spec_.norm_order);
  // The vocabulary projection and cross-entropy (vocab_): materialised (N, V) logits over the
  // gathered LM head, or Ring-DTP over this rank's vocabulary rows (never gathered; its gradient
  // accumulates on this rank for every rank's batch, so it needs no reduce-scatter).
  const bool head_rows = params_.lm_head_sharding() == LmHeadSharding::vocab_rows;
  const Tensor lm_head = head_rows ? params_.local_value(P.lm_head) : head.value(P.lm_head);
  const double loss_scale = 1.0 / static_cast<double>(loss_tokens);
  struct ReleaseOnExit {  // after backward a no-op; after an error, what forward kept is freed
    schedules::VocabProjection& v;
    ~ReleaseOnExit() { v.release(); }
  } release_vocab_on_exit{*vocab_};
  double loss = vocab_->forward(xf, lm_head, batch.labels, loss_scale);
  if (!with_backward) vocab_->release();
  if (W > 1) {
    double total[1] = {loss};
    all_reduce_host(comm_, backend_, stream_, total);
    loss = total[0];
  }
  if (with_aux_loss && spec_.aux_loss_coef != 0.0) loss += router_aux_loss(B * T, with_backward);
  if (!with_backward) {
    zero.release(std::move(head));
    zero.end();
    return loss;
  }

  OwnedTensor dxf = device(Shape{N, H}, LiveSet::workspace, "d final norm");
  vocab_->backward(xf, lm_head, dxf,
                   head_rows ? params_.local_grad(P.lm_head) : head.grad(P.lm_head));
  OwnedTensor dx = device(Shape{N, H}, LiveSet::workspace, "d final hidden");
  ops::rmsnorm_backward(final_hidden, head.value(P.final_norm), rstdf, dxf, dx,
                        head.grad(P.final_norm), stream_);
  xf.reset();
  dxf.reset();
  final_hidden.reset();
  // NOTES: the last layer's input comes back only now, after the logits are gone: starting its
  // copy during the head would add a boundary to the step's largest moment.
  boundaries.prefetch(Lc - 1);
  // NOTES: the head holds prefetch (zero_pass_uses), so layer L-1's backward gather starts only
  // here, behind the head's reduce-scatter: one exposed gather per step, the price of keeping a
  // gathered layer out of the logits' moment (as SCO's restore of layer L-1 above).
  zero.release(std::move(head));
  for (int l = Lc - 1; l >= 0; --l) {
    enter(StepPhase::backward_attention);  // the layer's gather and input are its pass's
    Group w = zero.acquire();
    x = boundaries.restore(l);
    if (recompute) layer_forward(l, w, x, batch, acts[l], true);  // the output is dropped
    // NOTES: the next input is fetched after the recompute, not before: the recompute's output
    // (a boundary too, dropped at once) and the two inputs are then never live together, so SCO
    // holds at most two boundaries on device. Its copy runs while layer l's backward does.
    if (l > 0) boundaries.prefetch(l - 1);
    dx = layer_backward(l, w, dx, x, batch, acts[l]);
    zero.release(std::move(w));  // its reduce-scatter overlaps layer l-1's backward
    if (l > 0) boundaries.release(l);
  }
  {
    enter(StepPhase::embedding);
    Group embed = zero.acquire();  // gradients only
    ops::embedding_backward(batch.input_ids, dx, embed.grad(P.embed), stream_);
    zero.release(std::move(embed));
  }
  zero.end();
  stream_.synchronize();
  boundaries.end();
  aux_dprobs_.reset();
  return loss;
}

void DecoderModel::accumulate_router_prob_sums(const Tensor& probs) {
  const int64_t N = probs.size(0), E = probs.size(1);
  std::vector<double> host = copy_to_host_as_double(probs, backend_, stream_);
  std::vector<double> sums(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) sums[e] += host[n * E + e];
  }
  // NOTES: each rank sums its own tokens first, then the ranks' sums are added; on one rank the
  // order is the plain token order, so W ranks agree with one rank to rounding, not bitwise.
  if (comm_.world_size() > 1) all_reduce_host(comm_, backend_, stream_, sums);
  for (int64_t e = 0; e < E; ++e) router_prob_sums_[e] += sums[e];
}

double DecoderModel::router_aux_loss(int64_t tokens, bool with_backward) {
  if (spec_.aux_loss_per_sequence) {  // each layer's, formed in its forward (sequence groups')
    double total[1] = {sequence_aux_loss_};
    if (comm_.world_size() > 1) all_reduce_host(comm_, backend_, stream_, total);
    return total[0];
  }
  // transformers' load_balancing_loss_func over the MoE layers' router rows (R = tokens x MoE
  // layers, the job's tokens):
  //   aux = E * sum_e (c_e / R) * (S_e / R),  c_e = routed (token, slot) pairs to e, S_e = sum of
  //   probs[., e]; d aux / d probs[row, e] = E * c_e / R^2 for every row of every layer.
  const int64_t E = spec_.experts();
  const double R = static_cast<double>(tokens * spec_.moe_layers());
  std::vector<double> counts(static_cast<size_t>(E), 0.0);
  for (const auto& layer : expert_load_) {  // empty for a dense layer
    for (size_t e = 0; e < layer.size(); ++e) counts[e] += static_cast<double>(layer[e]);
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (counts[e] / R) * (router_prob_sums_[e] / R);
  aux *= static_cast<double>(E);
  if (with_backward) {
    aux_dprobs_ = device(Shape{E}, LiveSet::workspace, "aux loss d probs");
    std::vector<double> host(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      host[static_cast<size_t>(e)] =
          spec_.aux_loss_coef * static_cast<double>(E) * counts[e] / (R * R);
    }
    copy_from_host_as(host, aux_dprobs_, backend_, stream_);  // rounded to the model's dtype
  }
  return spec_.aux_loss_coef * aux;
}

double DecoderModel::forward_backward(const TokenBatch& batch, int64_t loss_tokens) {
  return run(batch, loss_tokens, true);
}

double DecoderModel::forward_loss(const TokenBatch& batch, int64_t loss_tokens) {
  return run(batch, loss_tokens, false);
}

double DecoderModel::forward_cross_entropy(const TokenBatch& batch, int64_t loss_tokens) {
  return run(batch, loss_tokens, false, /*with_aux_loss=*/false);
}

}  // namespace moepeak
