// attention_bytes / workspace_bytes: the model's own live sets (see decoder_memory.h; every term
// names the allocation in core/model/decoder.cpp or decoder_latent_attention.cpp it stands for).
// Test: ctest -R 'test_model_memory|test_plan'
#include "core/model/decoder_memory.h"

#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/decoder_spec.h"
#include "core/model/param_layout.h"
#include "core/runtime/arena.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/dispatch_choice.h"
#include "ops/schedules/ulysses.h"

namespace moepeak {
namespace {

uint64_t fp(int64_t bytes) { return DeviceArena::footprint(static_cast<uint64_t>(bytes)); }

uint64_t max_of(std::initializer_list<uint64_t> v) { return *std::max_element(v.begin(), v.end()); }

int64_t numel(const Shape& s) { return s.numel(); }

// Layers whose activations are live at once during backward.
int64_t resident_layers(const ModelConfig& model, CheckpointSchedule checkpoint) {
  return schedules::resident_layers(checkpoint, model.num_hidden_layers);
}

// The Ulysses layout of world rank `rank`: rank r % Sp of a group of Sp ranks holding
// B/(W/Sp) sequences, with the heads and head width of the spec's attention (as DecoderModel::run
// makes it; for latent attention the q/k heads' width, nope + rope, not ModelConfig::head_dim).
schedules::UlyssesLayout layout_of(const AttentionSpec& a, int64_t B, int64_t T,
                                   const ParallelDegrees& d, int rank) {
  return schedules::UlyssesLayout::make(B / d.sequence_groups(), T, d.sequence, rank % d.sequence,
                                        a.heads, a.kv_heads, a.head_dim);
}

// One layer's attention tensors on a rank, in arena footprints of b-byte elements, from its
// AttentionSpec (d the q/k head width, dv the value heads', = d for grouped-query attention):
//   q, k, v, out          the token layout (N, nh d), (N, nkv d), (N, nkv dv), (N, nh dv)
//   q_heads ... out_heads the head layout (B, T, h_r, d or dv) (= the token layout when Sp = 1)
//   lse                   (B, h_q,r, T) in the op's lse dtype
//   staging               Ulysses' staging (Sp > 1): DecoderModel::ulysses_staging, the larger
//                         of the q/k layout's and the value layout's (ulysses_exchange_bytes)
//   kept_extra            the rest of what the layer keeps in `attention`: with qk_norm the
//                         projections before it and their rstds; latent: the q latent, its norm
//                         and rstd (q_lora_rank > 0), the kv latent, its norm and rstd
//   forward_workspace     the block's `workspace` peak in forward, the attention residual h
//                         included (grouped-query: h alone; latent: the q in Hub order, the
//                         kv_a output, the rotary key, the kv_b output, then h)
//   backward_tail         the backward's `workspace` peak from the moment dq, dk, dv are in the
//                         token layout (q + k + v) on (grouped-query: + dn1 + dx; latent: the
//                         rotary key's gradient and its per-head part, d kv_b, d latent, d kv_a,
//                         dn1, dq in Hub order, d q latent, dx)
struct AttentionBytes {
  uint64_t q = 0, k = 0, v = 0, out = 0, q_heads = 0, k_heads = 0, v_heads = 0, out_heads = 0;
  uint64_t lse = 0, staging = 0, kept_extra = 0, forward_workspace = 0, backward_tail = 0;
};

AttentionBytes attention_bytes_of(const AttentionSpec& a, int64_t B, int64_t T,
                                  const ParallelDegrees& degrees, int rank, int64_t H,
                                  DType dtype) {
  using schedules::HeadKind;
  const schedules::UlyssesLayout U = layout_of(a, B, T, degrees, rank);
  schedules::UlyssesLayout Uv = U;  // the value heads' (DecoderModel::values_layout)
  Uv.head_dim = a.value_dim();
  const int64_t b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t N = U.local_tokens(), nh = a.heads, nkv = a.kv_heads, d = a.head_dim;
  const int64_t dv = a.value_dim();
  const uint64_t NH = fp(N * H * b), Nb = fp(N * b);
  AttentionBytes x;
  x.q = fp(N * nh * d * b);
  x.k = fp(N * nkv * d * b);
  x.v = fp(N * nkv * dv * b);
  x.out = fp(N * nh * dv * b);  // "attention output" (and its token layout under Ulysses)
  x.q_heads = fp(numel(U.heads_shape(HeadKind::query)) * b);
  x.k_heads = fp(numel(U.heads_shape(HeadKind::kv)) * b);
  x.v_heads = fp(numel(Uv.heads_shape(HeadKind::kv)) * b);
  x.out_heads = fp(numel(Uv.heads_shape(HeadKind::query)) * b);
  x.lse = fp(U.batch * U.heads_count(HeadKind::query, static_cast<int>(U.rank)) * T *
             static_cast<int64_t>(dtype_size(ops::attention_lse_dtype(dtype))));
  if (degrees.sequence > 1) {
    x.staging = std::max(schedules::ulysses_exchange_bytes(U, dtype),
                         schedules::ulysses_exchange_bytes(Uv, dtype));
  }
  if (!a.latent()) {
    // With a per-head q/k norm: "q_pre", "k_pre" (token layout), "q norm rstd", "k norm rstd".
    x.kept_extra = a.qk_norm ? x.q + x.k + fp(N * nh * b) + fp(N * nkv * b) : 0;
    x.forward_workspace = NH;                     // "attention residual"
    x.backward_tail = x.q + x.k + x.v + NH + NH;  // dq, dk, dv; dn1, dx
    return x;
  }
  // Latent (core/model/decoder_latent_attention.cpp).
  const int64_t dr = a.rope_dim, dn = d - dr, rq = a.q_lora_rank, rkv = a.kv_lora_rank;
  const uint64_t Lq = rq > 0 ? fp(N * rq * b) : 0, Lkv = fp(N * rkv * b);
  const uint64_t C = fp(N * (rkv + dr) * b);        // "kv_a projection", "d kv_a projection"
  const uint64_t R = fp(N * dr * b);                // "rotary key", "d rotary key (one head)"
  const uint64_t KVb = fp(N * nh * (dn + dv) * b);  // "kv_b projection", "d kv_b projection"
  // "q latent", "q latent norm", "q latent norm rstd"; "kv latent", "kv latent norm", its rstd.
  x.kept_extra = (rq > 0 ? 2 * Lq + Nb : 0) + 2 * Lkv + Nb;
  // "q (Hub order)" beside the kv_a output and the rotary key, then beside the rotary key and the
  // kv_b output (the kv_a output freed); all freed before h.
  x.forward_workspace = std::max(x.q + R + std::max(C, KVb), NH);
  // From dq, dk, dv in the token layout: + "d rotary key" and "d rotary key (one head)"; + d kv_b
  // (the one head's part freed); dq, d rotary key, d kv_b and "d kv latent norm" (dk, dv freed);
  // dq, d rotary key, d latent and "d kv_a projection" (d kv_b freed); dq, d kv_a and dn1 (the
  // latent and the rotary key's gradients freed); dq, dn1 and "dq (Hub order)" (d kv_a freed);
  // dq in Hub order, dn1 and "d q latent norm" (dq freed); dn1 and dx.
  x.backward_tail = max_of({x.q + x.k + x.v + 2 * R, x.q + x.k + x.v + R + KVb, x.q + R + KVb + Lkv,
                            x.q + R + Lkv + C, x.q + C + NH, 2 * x.q + NH, x.q + NH + Lq, 2 * NH});
  return x;
}

PhaseBytes attention_on_rank(const ModelConfig& m, int64_t B, int64_t T,
                             const ParallelDegrees& degrees, int rank,
                             CheckpointSchedule checkpoint, DType dtype) {
  // Every layer's attention has the front layer's dims (DecoderModel::run's one Ulysses layout).
  const DecoderSpec spec = describe_decoder(m);
  const AttentionSpec& front = spec.layers.front().attention;
  const AttentionBytes a = attention_bytes_of(front, B, T, degrees, rank, m.hidden_size, dtype);
  const int world = degrees.sequence;  // the exchange's ranks
  const int64_t b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t N = layout_of(front, B, T, degrees, rank).local_tokens(), H = m.hidden_size;
  const uint64_t NH = fp(N * H * b), Nb = fp(N * b);
  const auto layers = static_cast<uint64_t>(resident_layers(m, checkpoint));
  const bool none = !schedules::recomputes_layers(checkpoint);
  PhaseBytes p;
  uint64_t kept_all = 0;  // every resident layer's kept activations
  if (world == 1) {
    // n1, rstd1, [q_pre, k_pre and their rstd | the latents], q, k, v (moved into the layer's
    // activations), out, lse.
    const uint64_t kept = NH + Nb + a.kept_extra + a.q + a.k + a.v + a.out + a.lse;
    kept_all = layers * kept;
    p[StepPhase::forward_attention] = layers * kept;
    p[StepPhase::backward_attention] = layers * kept;
  } else {
    const uint64_t S = a.staging;
    // Kept: n1, rstd1, [q_pre, k_pre and their rstd | the latents], q/k/v in the head layout,
    // out, lse, and the token-layout output.
    const uint64_t kept =
        NH + Nb + a.kept_extra + a.q_heads + a.k_heads + a.v_heads + a.out + a.lse + a.out;
    // Forward: the token-layout q, k, v beside the staging and the head-layout ones, before they
    // are freed; then out, lse and the token-layout output beside the staging. Backward: kept + S,
    // and under checkpointing the layer's recompute (its forward) before it.
    const uint64_t forward = NH + Nb + a.kept_extra + S + a.q_heads + a.k_heads + a.v_heads +
                             std::max(a.q + a.k + a.v, a.out + a.lse + a.out);
    p[StepPhase::forward_attention] = (layers - 1) * kept + forward;
    p[StepPhase::backward_attention] =
        (layers - 1) * kept + (none ? kept + S : std::max(forward, kept + S));
    kept_all = layers * kept;  // the staging is freed when attention returns
  }
  p[StepPhase::forward_experts] = kept_all;  // the layer's own kept beside its experts
  p[StepPhase::backward_experts] = kept_all;
  // Under checkpointing each layer's activations are dropped after its forward: none at the head.
  p[StepPhase::head] = none ? kept_all : 0;
  return p;
}

PhaseBytes workspace_on_rank(const ModelConfig& m, int64_t B, int64_t T,
                             const ParallelDegrees& degrees, int rank, const SchedulesConfig& s,
                             DType dtype, bool document_mask) {
  const DecoderSpec spec = describe_decoder(m);
  const int world = degrees.world;
  const int64_t b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t N = layout_of(spec.layers.front().attention, B, T, degrees, rank).local_tokens();
  const int64_t H = m.hidden_size;
  const int64_t E = m.num_local_experts, k = m.num_experts_per_tok;
  const uint64_t NH = fp(N * H * b), Nb = fp(N * b), NE = fp(N * E * b);
  const uint64_t Ki = fp(N * k * 4), Kb = fp(N * k * b);
  const bool none = !schedules::recomputes_layers(s.checkpoint);  // every layer's activations kept
  // The load-balancing loss over the job's tokens, or DeepSeek-V3's sequence-wise one.
  const bool aux = m.router_aux_loss_coef != 0.0 && !spec.aux_loss_per_sequence;
  const bool sequence_aux = m.router_aux_loss_coef != 0.0 && spec.aux_loss_per_sequence;
  const int64_t Bg = layout_of(spec.layers.front().attention, B, T, degrees, rank).batch;

  // The trainer's batch, for the whole run: input ids, labels, positions (i64) and, with
  // training.document_mask, the document starts of the sequence group's whole sequences (i32).
  const uint64_t batch_tensors = 3 * fp(8 * N) + (document_mask ? fp(Bg * T * 4) : 0);
  // The dispatcher's small count exchange (workspace, during its forward's planning).
  const uint64_t counts = schedules::dispatch_workspace_bytes(
      s, {N, k, H, m.expert_intermediate_size(), E, degrees.expert,
          schedules::resident_layers(s.checkpoint, spec.moe_layers()), dtype});
  // The recompute of a MoE layer under PipelinedLLEP only plans (no output: DecoderModel's
  // plan_only), so its shared experts make no activation then.
  const bool plan_only_recompute = s.dispatch == DispatchSchedule::pipelined_llep;
  // The load-balancing loss: its per-expert gradient (E) from the head to the end of backward,
  // and the all-reduce of the probability sums in each layer's forward (W > 1); the expert
  // counts' all-reduce over the expert replicas (W/Ep > 1) in each layer's forward.
  // The sequence-wise loss: its per-sequence counts and sums all-reduced over the sequence group
  // (2 B_g E doubles, Sp > 1) in each layer's forward, and its per-sequence gradient (B_g, E)
  // beside the router's in each layer's backward (DecoderModel::sequence_balance_backward).
  const uint64_t aux_dprobs = aux ? fp(E * b) : 0;
  const uint64_t aux_reduce =
      max_of({aux && world > 1 ? fp(E * 8) : 0, degrees.expert_replicas() > 1 ? fp(E * 8) : 0,
              sequence_aux && degrees.sequence > 1 ? fp(2 * Bg * E * 8) : 0});
  const uint64_t sequence_dprobs = sequence_aux ? fp(Bg * E * b) : 0;

  // What each layer keeps from forward (LayerActivations in workspace): the attention residual
  // h, n2, rstd2, then a MoE layer's probs (N, E), top-k index (i32) and weights and its shared
  // experts' gate and up (N, Is) x2, or a dense layer's gate and up projections (N, I) x2.
  auto shared_of = [&](const MlpSpec& mlp) {
    return mlp.moe() && mlp.shared_intermediate > 0 ? fp(N * mlp.shared_intermediate * b) : 0;
  };
  auto kept_of = [&](const MlpSpec& mlp) {
    return 2 * NH + Nb +
           (mlp.moe() ? NE + Ki + Kb + 2 * shared_of(mlp) : 2 * fp(N * mlp.intermediate * b));
  };
  uint64_t all_kept = 0;  // every layer's, under "none"
  for (const LayerSpec& l : spec.layers) all_kept += none ? kept_of(l.mlp) : 0;

  // Per layer l, forward (and under checkpointing its recompute, beside the incoming gradient
  // and the final rstd): in attention its temporaries and its residual h, then in the MLP its
  // activations plus the router logits (and, bf16 with a correction bias, its fp32 copy) or a
  // count exchange before the shared experts, their SwiGLU activation, the counts' all-reduces
  // after them (MoE), or the SwiGLU activation (dense); the backward of layer l: rstdf, the
  // incoming gradient dy and the layers' activations, then per moment dn2 with the router's
  // gradients, the shared experts' SwiGLU gradients, dn2 with dh (MoE), dn2 with the activation
  // and its gradients (dense), and attention's gradients beside dh (attention).
  uint64_t forward_attention = 0, forward = 0, recompute_attention = 0, recompute = 0;
  uint64_t backward_experts = 0, backward_attention = 0;
  uint64_t earlier = 0;  // the layers before l's, under "none"
  // Every layer's attention has the front layer's dims (DecoderModel::run's one Ulysses layout):
  // its backward's gradients, dattn=dout (and its head layout), dq, dk, dv (in both layouts, one
  // at a time), then the kind's own tail.
  const AttentionBytes a =
      attention_bytes_of(spec.layers.front().attention, B, T, degrees, rank, H, dtype);
  uint64_t attn;
  if (degrees.sequence == 1) {  // no Ulysses exchange
    attn = std::max(a.out + a.q + a.k + a.v, a.backward_tail);
  } else {
    attn = max_of({a.out + a.out_heads, a.out_heads + a.q_heads + a.k_heads + a.v_heads,
                   a.q_heads + a.k_heads + a.v_heads + a.q, a.q + a.k_heads + a.v_heads + a.k,
                   a.q + a.k + a.v_heads + a.v, a.backward_tail});
  }
  for (const LayerSpec& l : spec.layers) {
    const uint64_t kept = kept_of(l.mlp), Is = shared_of(l.mlp);
    const uint64_t kept_before_shared = kept - 2 * Is;
    const uint64_t NI = fp(N * l.mlp.intermediate * b);
    // "router correction bias (fp32)": a bf16 model's correction bias widened for the router.
    const uint64_t bias_f32 =
        l.mlp.moe() && l.mlp.router.correction_bias && dtype == DType::bf16 ? fp(E * 4) : 0;
    forward_attention = std::max(forward_attention, earlier + a.forward_workspace);
    const uint64_t moe_forward =
        max_of({kept_before_shared + NE + bias_f32, kept_before_shared + counts, kept + Is,
                kept + aux_reduce});
    forward = std::max(forward, earlier + (l.mlp.moe() ? moe_forward : kept + NI));
    if (!none) {
      recompute_attention =
          std::max(recompute_attention, Nb + aux_dprobs + NH + a.forward_workspace);
      const uint64_t moe_recompute =
          max_of({kept_before_shared + NE + bias_f32, kept_before_shared + counts,
                  kept + (plan_only_recompute ? 0 : Is)});
      recompute = std::max(recompute, Nb + aux_dprobs + NH + (l.mlp.moe() ? moe_recompute : kept));
    }
    const uint64_t base = Nb + aux_dprobs + NH + (none ? earlier + kept : kept);
    // (No count exchange here: every dispatcher exchanges its counts in its forward only.)
    const uint64_t mlp_backward =
        l.mlp.moe() ? max_of({NH + Kb + NE + sequence_dprobs, NH + Kb + 3 * Is, NH + NH})
                    : NH + std::max(3 * NI, NH);
    backward_experts = std::max(backward_experts, base + mlp_backward);
    backward_attention = std::max(backward_attention, base + NH + attn);
    earlier += none ? kept : 0;
  }
  // Head: final norm xf and rstdf, d xf and d final hidden (the ZeRO-3 reduce-scatters run in
  // place in the gathered grads: no temporary here).
  const uint64_t head = all_kept + aux_dprobs + NH + Nb + NH + NH;
  // After the step: the grad norm's partials (f64) and its all-reduce; the metrics' all-gather.
  const uint64_t after = std::max(fp(8 * ops::kSumSquaresParts) + (world > 1 ? fp(8) : 0),
                                  world > 1 ? fp(16) + fp(16 * world) : 0);
  PhaseBytes p;
  // The embedding: its output is a boundary; its backward holds rstdf and layer 0's dx.
  p[StepPhase::embedding] = batch_tensors + Nb + aux_dprobs + NH;
  p[StepPhase::forward_attention] = batch_tensors + forward_attention;
  p[StepPhase::forward_experts] = batch_tensors + forward;
  p[StepPhase::head] = batch_tensors + head;
  p[StepPhase::backward_experts] = batch_tensors + std::max(recompute, backward_experts);
  p[StepPhase::backward_attention] =
      batch_tensors + std::max(recompute_attention, backward_attention);
  p[StepPhase::optimizer] = batch_tensors + after;
  return p;
}

// The largest of every rank of a sequence group, phase by phase (groups alike: a rank's attention
// and MoE shapes depend on its rank in the sequence group only).
template <class OnRank>
PhaseBytes largest_rank(const ParallelDegrees& degrees, OnRank on_rank) {
  PhaseBytes most;
  for (int r = 0; r < degrees.sequence; ++r) {
    const PhaseBytes p = on_rank(r);
    for (StepPhase ph : kAllStepPhases) most[ph] = std::max(most[ph], p[ph]);
  }
  return most;
}

}  // namespace

PhaseBytes attention_phase_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                                 const ParallelDegrees& degrees, CheckpointSchedule checkpoint,
                                 DType dtype) {
  return largest_rank(degrees, [&](int r) {
    return attention_on_rank(model, batch, seq_len, degrees, r, checkpoint, dtype);
  });
}

PhaseBytes workspace_phase_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                                 const ParallelDegrees& degrees, const SchedulesConfig& schedules,
                                 DType dtype, bool document_mask) {
  return largest_rank(degrees, [&](int r) {
    return workspace_on_rank(model, batch, seq_len, degrees, r, schedules, dtype, document_mask);
  });
}

uint64_t attention_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, CheckpointSchedule checkpoint,
                         DType dtype) {
  return attention_phase_bytes(model, batch, seq_len, degrees, checkpoint, dtype).max();
}

uint64_t workspace_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, const SchedulesConfig& schedules,
                         DType dtype, bool document_mask) {
  return workspace_phase_bytes(model, batch, seq_len, degrees, schedules, dtype, document_mask)
      .max();
}

bool live_in_phase(LiveSet set, StepPhase phase, const SchedulesConfig& schedules,
                   OptimizerPlacement placement) {
  const bool optimizer = phase == StepPhase::optimizer;
  switch (set) {
    case LiveSet::optimizer:  // resident AdamW state always; the offloads' staging in its step
      return placement == OptimizerPlacement::resident || optimizer;
    case LiveSet::dispatch:  // kept from forward to backward by every layer under "none"
      return phase == StepPhase::forward_experts || phase == StepPhase::backward_experts ||
             (!schedules::recomputes_layers(schedules.checkpoint) && !optimizer &&
              phase != StepPhase::embedding);
    case LiveSet::logits:
      return phase == StepPhase::head;
    case LiveSet::weights:  // per phase: the ZeRO-3 uses in it (zero_phase_gathered_bytes)
    case LiveSet::grads:
    case LiveSet::boundaries:  // its checkpoint schedule's (BoundariesBytes::phases)
    case LiveSet::attention:   // the model's own: attention_phase_bytes, workspace_phase_bytes
    case LiveSet::workspace:
      break;
  }
  MOEPEAK_THROW("live_in_phase: ", live_set_name(set),
                " has bytes per phase of its own (attention_phase_bytes, workspace_phase_bytes, "
                "zero_phase_gathered_bytes, BoundariesBytes::phases)");
}

int model_group_communicators(const ParallelDegrees& d, const SchedulesConfig& s,
                              int64_t zero_prefetch_depth) {
  const int W = d.world;
  if (W <= 1) return 0;
  int count = 1;  // the world
  const int Ep = d.expert, Sp = d.sequence, Ds = d.data_shard;
  for (int size : {Ep, W / Ep, Sp, Ds, W / Ds}) count += size > 1 && size < W;
  if (zero_prefetch_depth >= 1) {
    for (int size : {Ds, W / Ep, W / Ds}) count += size > 1;
  }
  if (s.vocab == VocabSchedule::ring_dtp) ++count;
  if (s.dispatch == DispatchSchedule::pipelined_llep && Ep > 1) count += 2;
  return count;
}

OutsideArena model_outside_arena(const ParallelDegrees& d, const Config& cfg) {
  return cuda_outside_arena(
      {model_group_communicators(d, cfg.schedules, cfg.parallelism.zero_prefetch_depth), 1});
}

}  // namespace moepeak
