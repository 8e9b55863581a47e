// predict_step_time: the step-time model (see step_time.h).
#include "core/plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/model/param_layout.h"
#include "core/plan/layout_search.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/vocab_choice.h"

namespace moepeak {
namespace {

// NOTES: the elementwise traffic of a layer per token and pass besides the SwiGLU, in units of H
// working-dtype elements: the two RMSNorms (read, write, and their backward's reads), the
// residual adds, RoPE on q and k, the permutes to and from the experts and the router's scores.
// A count of the model's passes over (N, H)-sized tensors, rounded. The SwiGLU is counted apart
// (kSwigluBytesPerElement per activated element, step_time.h) because it scales with F and k.
constexpr double kElementwiseBytesPerToken = 18.0;
// NOTES: the ops a layer issues per pass (DecoderModel: the norm, q/k/v and o projections, RoPE,
// attention and the residual add; the norm, router, top-k, permutes, the experts' three grouped
// GEMMs, the SwiGLU, the combine and the residual), the backward about twice that, the head's
// (norm, LM head, loss, their backward) and the optimizer's (a gradient-norm pass and an update
// per parameter tensor). Counted from the decoder's calls, rounded; the launch term is only as
// good as these counts, and it matters only where ops are small (the tiny presets on the CPU).
constexpr double kOpsAttentionForward = 10, kOpsExpertsForward = 12;
constexpr double kOpsHead = 8, kOpsEmbedding = 4, kOpsPerParameterTensor = 2;
// AdamW's device traffic per parameter: read weight, gradient, m, v and write weight, m, v
// (fp32), plus the gradient norm's read of the gradient.
constexpr double kAdamWBytesPerParameter = 32.0;

// The link of a group: `count` ranks `stride` apart from an aligned first rank (consecutive runs:
// stride 1) stay in one node when they span at most its ranks.
struct Link {
  double bytes_per_s, latency_s;
  const char* name;
};
Link group_link(const MachineRates& r, int count, int stride) {
  const bool one_node = static_cast<int64_t>(count - 1) * stride < r.ranks_per_node;
  return one_node ? Link{r.node_link_bytes_per_s, r.node_link_latency_s, "node"}
                  : Link{r.network_bytes_per_s, r.network_latency_s, "network"};
}

// A ring collective moving `bytes` per rank over `ranks` ranks, `calls` times.
double collective_s(double bytes, int ranks, const Link& link, double calls) {
  if (ranks <= 1 || bytes <= 0) return 0;
  return bytes / link.bytes_per_s + calls * (ranks - 1) * link.latency_s;
}

// The matmul parameters a token meets in layer l's attention (its projections), its MLP's dense
// part (router, dense MLP or shared experts) and its routed experts (each of the k).
struct LayerParams {
  double attention = 0, dense_mlp = 0, expert = 0;
};
LayerParams layer_params(const LayerSpec& l, int64_t H) {
  const AttentionSpec& a = l.attention;
  const double h = static_cast<double>(H), nh = static_cast<double>(a.heads);
  const double d = static_cast<double>(a.head_dim), dv = static_cast<double>(a.value_dim());
  LayerParams p;
  if (a.latent()) {
    const double q = a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank * nh * d : h * nh * d;
    const double kv_a = h * static_cast<double>(a.kv_lora_rank + a.rope_dim);
    const double kv_b = static_cast<double>(a.kv_lora_rank) * nh *
                        (static_cast<double>(a.head_dim - a.rope_dim) + dv);
    p.attention = q + kv_a + kv_b + nh * dv * h;
  } else {
    const double nkv = static_cast<double>(a.kv_heads);
    p.attention = h * (nh * d + nkv * d + nkv * dv) + nh * dv * h;
  }
  const MlpSpec& m = l.mlp;
  if (m.moe()) {
    p.dense_mlp = h * static_cast<double>(m.experts) + 3.0 * h * m.shared_intermediate;
    p.expert = 3.0 * h * static_cast<double>(m.intermediate);
  } else {
    p.dense_mlp = 3.0 * h * static_cast<double>(m.intermediate);
  }
  return p;
}

// The causal (query, key) pairs one head of one sequence scores in a layer with window W.
double scored_pairs(int64_t T, int64_t W) {
  const double t = static_cast<double>(T);
  if (W == 0 || W >= T) return t * (t + 1) / 2;
  const double w = static_cast<double>(W);
  return w * (w + 1) / 2 + (t - w) * w;
}

// max(0, comm - hidden) per repetition, the first repetition's comm whole: a transfer that each
// repetition issues ahead behind the compute of the one before it.
double pipelined_exposed(double comm, double hidden, double repetitions) {
  if (repetitions <= 0 || comm <= 0) return 0;
  return comm + (repetitions - 1) * std::max(0.0, comm - hidden);
}

void check_rate(double value, const char* name, const MachineRates& r) {
  if (!(value > 0)) {
    MOEPEAK_INPUT_ERROR("step-time model: ", r.name, " has no ", name, " (", r.source,
                        "); a probe file from `moepeak probe` measures it");
  }
}

PhaseTime& at(StepTime& t, StepPhase p) { return t.phases[static_cast<size_t>(p)]; }

// Each phase's exposed time per collective, to name what bounds it.
using ExposedBy = std::array<std::vector<std::pair<std::string_view, double>>, kNumStepPhases>;

void add_comm(StepTime& t, ExposedBy& by, StepPhase phase, std::string_view collective, double comm,
              double exposed) {
  PhaseTime& p = at(t, phase);
  p.comm_s += comm;
  p.exposed_comm_s += exposed;
  by[static_cast<size_t>(phase)].emplace_back(collective, exposed);
}

void name_bound(PhaseTime& p, const std::vector<std::pair<std::string_view, double>>& comm) {
  std::pair<std::string_view, double> best{"", 0};
  for (const auto& c : std::initializer_list<std::pair<std::string_view, double>>{
           {"gemm", p.gemm_s},
           {"grouped_gemm", p.grouped_gemm_s},
           {"attention", p.attention_s},
           {"elementwise", p.elementwise_s},
           {"optimizer", p.optimizer_s},
           {"launches", p.launch_s}}) {
    if (c.second > best.second) best = c;
  }
  for (const auto& c : comm) {
    if (c.second > best.second) best = c;
  }
  p.bound = best.second > 0 ? std::string(best.first) : "-";
}

}  // namespace

StepTime predict_step_time(const Config& cfg, const Plan& plan, const MachineRates& rates) {
  const PlanInputs& in = plan.inputs;
  for (const auto& [v, name] : {std::pair{rates.gemm_flops, "GEMM rate"},
                                std::pair{rates.grouped_gemm_flops, "grouped GEMM rate"},
                                std::pair{rates.attention_flops, "attention rate"},
                                std::pair{rates.memory_bytes_per_s, "memory bandwidth"},
                                std::pair{rates.elementwise_bytes_per_s, "elementwise rate"},
                                std::pair{rates.loss_bytes_per_s, "loss rate"}}) {
    check_rate(v, name, rates);
  }
  const ModelConfig& m = cfg.model;
  const SchedulesConfig& s = cfg.schedules;
  const ParallelDegrees& d = in.degrees;
  const int W = d.world;
  const ParamLayout& layout = cached_param_layout(m);
  const DecoderSpec& spec = layout.spec();
  const double b = static_cast<double>(dtype_size(in.dtype));
  const double H = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  const double k = static_cast<double>(m.num_experts_per_tok);
  const double N = static_cast<double>(in.batch * in.seq_len) / W;
  const double Bg = static_cast<double>(in.batch) / d.sequence_groups();
  const double L = static_cast<double>(spec.layers.size());
  const bool recompute = schedules::recomputes_layers(s.checkpoint);
  // The backward's work in forwards: 2 for the GEMMs (dx and dw), 2.5 for attention (dQ, dK, dV
  // and the recomputed scores), elementwise 2; plus 1 when checkpointing recomputes the forward.
  const double again = recompute ? 1.0 : 0.0;
  const bool ring_dtp = s.vocab == VocabSchedule::ring_dtp && W > 1;

  StepTime t;
  ExposedBy by;
  t.rates = rates;
  t.world = W;
  for (size_t i = 0; i < kNumStepPhases; ++i) t.phases[i].phase = kAllStepPhases[i];

  // ---- compute, per micro-batch --------------------------------------------------------------
  double attention_gemm_flops = 0, mlp_gemm_flops = 0, expert_flops = 0, attention_flops = 0;
  double swiglu_elements = 0;  // per token and pass, over the layers
  for (const LayerSpec& l : spec.layers) {
    const MlpSpec& mlp = l.mlp;
    swiglu_elements +=
        static_cast<double>(mlp.moe() ? k * static_cast<double>(mlp.intermediate) +
                                            static_cast<double>(mlp.shared_intermediate)
                                      : static_cast<double>(mlp.intermediate));
    const LayerParams p = layer_params(l, m.hidden_size);
    attention_gemm_flops += 2 * N * p.attention;
    mlp_gemm_flops += 2 * N * p.dense_mlp;
    expert_flops += 2 * N * k * p.expert;
    const AttentionSpec& a = l.attention;
    attention_flops += 2 * Bg * static_cast<double>(a.heads) / d.sequence *
                       static_cast<double>(a.head_dim + a.value_dim()) *
                       scored_pairs(in.seq_len, a.window);
  }
  // A forward pass's elementwise work: the layers' (N, H) traffic, half with the attention and
  // half with the MLP, and the SwiGLU with the MLP.
  const double norms_pass_s =
      N * L * kElementwiseBytesPerToken * H * b / rates.elementwise_bytes_per_s;
  const double swiglu_pass_s =
      N * kSwigluBytesPerElement * swiglu_elements * b / rates.elementwise_bytes_per_s;
  const double attention_elementwise_s = norms_pass_s / 2;
  const double mlp_elementwise_s = norms_pass_s / 2 + swiglu_pass_s;
  const double gemm = rates.gemm_flops, grouped = rates.grouped_gemm_flops;
  PhaseTime& fa = at(t, StepPhase::forward_attention);
  fa.gemm_s = attention_gemm_flops / gemm;
  fa.attention_s = attention_flops / rates.attention_flops;
  fa.elementwise_s = attention_elementwise_s;
  PhaseTime& fe = at(t, StepPhase::forward_experts);
  fe.gemm_s = mlp_gemm_flops / gemm;
  fe.grouped_gemm_s = expert_flops / grouped;
  fe.elementwise_s = mlp_elementwise_s;
  PhaseTime& be = at(t, StepPhase::backward_experts);
  be.gemm_s = (2 + again) * mlp_gemm_flops / gemm;
  be.grouped_gemm_s = (2 + again) * expert_flops / grouped;
  be.elementwise_s = (2 + again) * mlp_elementwise_s;
  PhaseTime& ba = at(t, StepPhase::backward_attention);
  ba.gemm_s = (2 + again) * attention_gemm_flops / gemm;
  ba.attention_s = (2.5 + again) * attention_flops / rates.attention_flops;
  ba.elementwise_s = (2 + again) * attention_elementwise_s;
  PhaseTime& head = at(t, StepPhase::head);
  // The LM head: forward and both backward GEMMs over the whole vocabulary (Ring-DTP: the same
  // FLOPs in W strips of V/W), the softmax and its gradient over (N, V).
  head.gemm_s = 3 * 2 * N * V * H / gemm;
  head.elementwise_s = kLossBytesPerLogit * N * V * b / rates.loss_bytes_per_s;
  PhaseTime& emb = at(t, StepPhase::embedding);
  emb.elementwise_s = 2 * N * H * b / rates.elementwise_bytes_per_s;
  const double op = rates.op_latency_s;
  fa.launch_s = L * kOpsAttentionForward * op;
  fe.launch_s = L * kOpsExpertsForward * op;
  ba.launch_s = (2 + again) * fa.launch_s;
  be.launch_s = (2 + again) * fe.launch_s;
  head.launch_s = kOpsHead * op;
  emb.launch_s = kOpsEmbedding * op;

  // ---- collectives, per micro-batch ------------------------------------------------------------
  const StepTraffic traffic = step_traffic(cfg, d, in.batch, in.seq_len, 1, in.dtype);
  const int depth = static_cast<int>(cfg.parallelism.zero_prefetch_depth);
  // ZeRO-3: the data-shard group (consecutive Ds ranks) for the dense weights, the expert
  // replicas (W/Ep ranks Ep apart) for the experts; a gather in forward, one in backward (with
  // the recompute), a reduce-scatter in backward: each a third of step_traffic's volume.
  const Link shard_link = group_link(rates, d.data_shard, 1);
  const Link replica_link = group_link(rates, d.expert_replicas(), d.expert);
  const double zero_call_s =
      collective_s(traffic.zero_dense / 3, d.data_shard, shard_link, L + 1) +
      collective_s(traffic.zero_experts / 3, d.expert_replicas(), replica_link, L);
  const double per_layer_zero = zero_call_s / (L + 1);
  auto zero_exposed = [&](double compute_per_layer) {
    return depth >= 1 ? pipelined_exposed(per_layer_zero, compute_per_layer, L + 1) : zero_call_s;
  };
  const double forward_layer_s = (fa.compute_s() + fe.compute_s()) / L;
  const double backward_layer_s = (be.compute_s() + ba.compute_s()) / L;
  add_comm(t, by, StepPhase::forward_attention, "zero3", zero_call_s,
           zero_exposed(forward_layer_s));
  add_comm(t, by, StepPhase::backward_experts, "zero3", zero_call_s,
           zero_exposed(backward_layer_s));
  add_comm(t, by, StepPhase::backward_attention, "zero3", zero_call_s,
           zero_exposed(backward_layer_s));

  // Ulysses: q, k, v and out each way, exposed; step_traffic counts the passes.
  const double passes = recompute ? 3.0 : 2.0;
  const Link sequence_link = group_link(rates, d.sequence, 1);
  const double ulysses_pass_s =
      collective_s(traffic.ulysses / passes, d.sequence, sequence_link, 4 * L);
  add_comm(t, by, StepPhase::forward_attention, "ulysses", ulysses_pass_s, ulysses_pass_s);
  add_comm(t, by, StepPhase::backward_attention, "ulysses", (passes - 1) * ulysses_pass_s,
           (passes - 1) * ulysses_pass_s);

  // The dispatch: out to the experts and back, per MoE layer and pass.
  const double L_moe = static_cast<double>(spec.moe_layers());
  const Link expert_link = group_link(rates, d.expert, 1);
  const double dispatch_pass_s =
      collective_s(traffic.dispatch / passes, d.expert, expert_link, 2 * L_moe);
  auto dispatch_exposed = [&](double comm, double experts) {
    if (s.dispatch != DispatchSchedule::pipelined_llep) return comm;
    const double chunks = std::clamp(std::ceil(N / static_cast<double>(s.chunk_tokens)), 1.0,
                                     static_cast<double>(s.max_chunks));
    return std::max(0.0, comm - experts) + comm / chunks;
  };
  add_comm(t, by, StepPhase::forward_experts, "dispatch", dispatch_pass_s,
           dispatch_exposed(dispatch_pass_s, fe.grouped_gemm_s));
  add_comm(t, by, StepPhase::backward_experts, "dispatch", (passes - 1) * dispatch_pass_s,
           dispatch_exposed((passes - 1) * dispatch_pass_s, be.grouped_gemm_s));

  // Ring-DTP: W - 1 rounds in each of its three passes, each round's send behind its strip.
  if (ring_dtp) {
    const Link world_link = group_link(rates, W, 1);
    const double round_comm = collective_s(traffic.vocab / (3.0 * (W - 1)), 2, world_link, 1);
    const double round_gemm = head.gemm_s / (3.0 * W);
    add_comm(t, by, StepPhase::head, "vocab", 3.0 * (W - 1) * round_comm,
             3.0 * (W - 1) * std::max(0.0, round_comm - round_gemm));
  }

  // SCO: the offloaded layers' boundaries out in forward and back in backward, on a copy
  // stream behind the layers' compute.
  if (s.checkpoint == CheckpointSchedule::sco && rates.host_link_bytes_per_s > 0) {
    const double layers = static_cast<double>(plan.sco_offloaded_layers);
    const double copy = N * H * b / rates.host_link_bytes_per_s;
    add_comm(t, by, StepPhase::forward_attention, "sco", layers * copy,
             layers * std::max(0.0, copy - forward_layer_s));
    add_comm(t, by, StepPhase::backward_attention, "sco", layers * copy,
             layers * std::max(0.0, copy - backward_layer_s));
  }

  // ---- the step: m micro-batches, then the optimizer ----------------------------------------
  const double mb = static_cast<double>(in.grad_accum);
  for (size_t i = 0; i < kNumStepPhases; ++i) {
    PhaseTime& p = t.phases[i];
    for (double* v : {&p.gemm_s, &p.grouped_gemm_s, &p.attention_s, &p.elementwise_s, &p.launch_s,
                      &p.comm_s, &p.exposed_comm_s}) {
      *v *= mb;
    }
    for (auto& [name, exposed] : by[i]) exposed *= mb;
  }
  PhaseTime& opt = at(t, StepPhase::optimizer);
  // The dense shards' replicas all-reduce their gradients once per micro-batch (step_traffic).
  const Link dense_link = group_link(rates, d.dense_replicas(), d.data_shard);
  const double replicas_s =
      mb * collective_s(traffic.dense_replicas, d.dense_replicas(), dense_link, L + 1);
  add_comm(t, by, StepPhase::optimizer, "replicas", replicas_s, replicas_s);
  // The rank's parameters: its dense shard and its share of its experts.
  const double expert_params = L_moe * static_cast<double>(m.num_local_experts) * 3.0 *
                               static_cast<double>(m.expert_intermediate_size()) * H;
  const double dense_params = static_cast<double>(layout.parameter_count()) - expert_params;
  const double local = dense_params / d.data_shard + expert_params / W;
  const OptimizerPlacement placement = cfg.optimizer.placement;
  if (placement == OptimizerPlacement::resident) {
    opt.optimizer_s = local * kAdamWBytesPerParameter / rates.memory_bytes_per_s;
  } else {
    check_rate(rates.host_link_bytes_per_s, "host link bandwidth", rates);
    check_rate(rates.host_memory_bytes_per_s, "host memory bandwidth", rates);
    const double d2h = local * 4 / rates.host_link_bytes_per_s;  // fp32 gradients out
    const double h2d = local * b / rates.host_link_bytes_per_s;  // weights back
    const double host = local * kAdamWBytesPerParameter / rates.host_memory_bytes_per_s;
    opt.optimizer_s = placement == OptimizerPlacement::offload_stream ? std::max({d2h, h2d, host})
                                                                      : d2h + h2d + host;
  }

  opt.launch_s =
      kOpsPerParameterTensor * static_cast<double>(layout.params().size()) * rates.op_latency_s;
  double step = 0;
  for (size_t i = 0; i < kNumStepPhases; ++i) {
    name_bound(t.phases[i], by[i]);
    step += t.phases[i].time_s();
  }
  t.step_s = step;
  // The model FLOPs (core/metrics/flops.h's step_flops, counted here from the same terms): three
  // times the forward's matmuls and attention, on every rank.
  t.flops =
      mb * W * 3.0 *
      (attention_gemm_flops + mlp_gemm_flops + expert_flops + 2 * N * V * H + attention_flops);
  t.tokens_per_s = step > 0 ? mb * static_cast<double>(in.batch * in.seq_len) / step : 0;
  t.mfu = step > 0 && rates.peak_flops > 0 ? t.flops / (step * W * rates.peak_flops) : 0;
  return t;
}

void order_layouts_by_step_time(const Config& cfg, LayoutSearch& search,
                                const MachineRates& rates) {
  for (LayoutRow& r : search.rows) {
    // The row's plan carries its layout (plan.inputs.degrees), which is all the model reads of it.
    if (r.valid && r.plan.fits()) r.step_s = predict_step_time(cfg, r.plan, rates).step_s;
  }
  std::stable_sort(search.rows.begin(), search.rows.end(),
                   [](const LayoutRow& a, const LayoutRow& b) {
                     const double ka = a.step_s > 0 ? a.step_s : HUGE_VAL;
                     const double kb = b.step_s > 0 ? b.step_s : HUGE_VAL;
                     return ka < kb;
                   });
  search.best = !search.rows.empty() && search.rows.front().step_s > 0 ? 0 : -1;
}

}  // namespace moepeak
