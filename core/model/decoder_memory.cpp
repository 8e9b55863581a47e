// attention_bytes / workspace_bytes: the model's own live sets (see decoder_memory.h; every term
// names the allocation in core/model/decoder.cpp it stands for). Test: ctest -R test_plan
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
// B/(W/Sp) sequences.
schedules::UlyssesLayout layout_of(const ModelConfig& m, int64_t B, int64_t T,
                                   const ParallelDegrees& d, int rank) {
  return schedules::UlyssesLayout::make(B / d.sequence_groups(), T, d.sequence, rank % d.sequence,
                                        m.num_attention_heads, m.num_key_value_heads,
                                        m.head_dim_resolved());
}

PhaseBytes attention_on_rank(const ModelConfig& m, int64_t B, int64_t T,
                             const ParallelDegrees& degrees, int rank,
                             CheckpointSchedule checkpoint, DType dtype) {
  const schedules::UlyssesLayout U = layout_of(m, B, T, degrees, rank);
  const int world = degrees.sequence;  // the exchange's ranks
  B = U.batch;
  const int64_t b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t N = U.local_tokens(), H = m.hidden_size, d = m.head_dim_resolved();
  const int64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const uint64_t NH = fp(N * H * b), Nb = fp(N * b);
  const uint64_t Q = fp(N * nh * d * b), KV = fp(N * nkv * d * b);
  const uint64_t Qh = fp(numel(U.heads_shape(schedules::HeadKind::query)) * b);
  const uint64_t KVh = fp(numel(U.heads_shape(schedules::HeadKind::kv)) * b);
  const uint64_t out = fp(N * nh * d * b);  // "attention output"
  const uint64_t lse = fp(B * U.heads_count(schedules::HeadKind::query, rank) * T *
                          static_cast<int64_t>(dtype_size(ops::attention_lse_dtype(dtype))));
  const auto layers = static_cast<uint64_t>(resident_layers(m, checkpoint));
  const bool none = !schedules::recomputes_layers(checkpoint);
  // With a per-head q/k norm: the projections before it ("q_pre", "k_pre", token layout) and its
  // rstd ("q norm rstd", "k norm rstd"), kept for its backward.
  const uint64_t qk_norm =
      describe_decoder(m).any_qk_norm() ? Q + KV + fp(N * nh * b) + fp(N * nkv * b) : 0;
  PhaseBytes p;
  uint64_t kept_all = 0;  // every resident layer's kept activations
  if (world == 1) {
    // n1, rstd1, [q_pre, k_pre and their rstd], q, k, v (moved into the layer's activations),
    // out, lse.
    const uint64_t kept = NH + Nb + qk_norm + Q + 2 * KV + out + lse;
    kept_all = layers * kept;
    p[StepPhase::forward_attention] = layers * kept;
    p[StepPhase::backward_attention] = layers * kept;
  } else {
    const uint64_t S = schedules::ulysses_exchange_bytes(U, dtype);
    // Kept: n1, rstd1, [q_pre, k_pre and their rstd], q/k/v in the head layout, out, lse, and
    // the token-layout output.
    const uint64_t kept = NH + Nb + qk_norm + Qh + 2 * KVh + out + lse + Q;
    // Forward: the token-layout q, k, v beside the staging and the head-layout ones, before they
    // are freed; then out, lse and the token-layout output beside the staging. Backward: kept + S.
    const uint64_t forward =
        NH + Nb + qk_norm + S + Qh + 2 * KVh + std::max(Q + 2 * KV, out + lse + Q);
    p[StepPhase::forward_attention] = (layers - 1) * kept + forward;
    p[StepPhase::backward_attention] = (layers - 1) * kept + std::max(forward, kept + S);
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
                             DType dtype) {
  const schedules::UlyssesLayout U = layout_of(m, B, T, degrees, rank);
  const int world = degrees.world;
  const int64_t b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t N = U.local_tokens(), H = m.hidden_size, d = m.head_dim_resolved();
  const int64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const int64_t E = m.num_local_experts, k = m.num_experts_per_tok;
  const uint64_t NH = fp(N * H * b), Nb = fp(N * b), NE = fp(N * E * b);
  const uint64_t Ki = fp(N * k * 4), Kb = fp(N * k * b);
  const uint64_t Q = fp(N * nh * d * b), KV = fp(N * nkv * d * b);
  const uint64_t Qh = fp(numel(U.heads_shape(schedules::HeadKind::query)) * b);
  const uint64_t KVh = fp(numel(U.heads_shape(schedules::HeadKind::kv)) * b);
  const bool none = !schedules::recomputes_layers(s.checkpoint);  // every layer's activations kept
  const bool aux = m.router_aux_loss_coef != 0.0;

  // The trainer's batch: input ids, labels, positions (i64), for the whole run.
  const uint64_t batch_tensors = 3 * fp(8 * N);
  // The dispatcher's small count exchange (workspace, during its forward's planning).
  const DecoderSpec spec = describe_decoder(m);
  const uint64_t counts = schedules::dispatch_workspace_bytes(
      s, {N, k, H, m.expert_intermediate_size(), E, degrees.expert,
          schedules::resident_layers(s.checkpoint, spec.moe_layers()), dtype});
  // The load-balancing loss: its per-expert gradient (E) from the head to the end of backward,
  // and the all-reduce of the probability sums in each layer's forward (W > 1); the expert
  // counts' all-reduce over the expert replicas (W/Ep > 1) in each layer's forward.
  const uint64_t aux_dprobs = aux ? fp(E * b) : 0;
  const uint64_t aux_reduce =
      std::max(aux && world > 1 ? fp(E * 8) : 0, degrees.expert_replicas() > 1 ? fp(E * 8) : 0);

  // What each layer keeps from forward (LayerActivations in workspace): the attention residual
  // h, n2, rstd2, then a MoE layer's probs (N, E), top-k index (i32) and weights, or a dense
  // layer's gate and up projections (N, I) x2.
  auto kept_of = [&](const MlpSpec& mlp) {
    return 2 * NH + Nb + (mlp.moe() ? NE + Ki + Kb : 2 * fp(N * mlp.intermediate * b));
  };
  uint64_t all_kept = 0;  // every layer's, under "none"
  for (const LayerSpec& l : spec.layers) all_kept += none ? kept_of(l.mlp) : 0;

  // Per layer l, forward (and under checkpointing its recompute, beside the incoming gradient
  // and the final rstd): in attention its residual h, then in the MLP its activations plus the
  // router logits or a count exchange (MoE), or the SwiGLU activation (dense); the backward of
  // layer l: rstdf, the incoming gradient dy and the layers' activations, then per moment dn2
  // with the router's gradients, dn2 with dh (MoE), dn2 with the activation and its gradients
  // (dense), and attention's gradients beside dh (attention).
  uint64_t attn;
  if (degrees.sequence == 1) {                             // no Ulysses exchange
    attn = std::max(2 * Q + 2 * KV, Q + 2 * KV + 2 * NH);  // dattn=dout, dq, dk, dv; dn1, dx
  } else {
    attn = max_of({Q + Qh, 2 * Qh + 2 * KVh, Qh + 2 * KVh + Q, Q + 2 * KVh + KV, Q + KVh + 2 * KV,
                   Q + 2 * KV + 2 * NH});
  }
  uint64_t forward_attention = 0, forward = 0, recompute_attention = 0, recompute = 0;
  uint64_t backward_experts = 0, backward_attention = 0;
  uint64_t earlier = 0;  // the layers before l's, under "none"
  for (const LayerSpec& l : spec.layers) {
    const uint64_t kept = kept_of(l.mlp);
    const uint64_t NI = fp(N * l.mlp.intermediate * b);
    forward_attention = std::max(forward_attention, earlier + NH);
    forward =
        std::max(forward, earlier + kept + (l.mlp.moe() ? max_of({NE, counts, aux_reduce}) : NI));
    if (!none) {
      recompute_attention = Nb + aux_dprobs + NH + NH;
      recompute = std::max(recompute,
                           Nb + aux_dprobs + NH + kept + (l.mlp.moe() ? std::max(NE, counts) : 0));
    }
    const uint64_t base = Nb + aux_dprobs + NH + (none ? earlier + kept : kept);
    const uint64_t mlp_backward =
        l.mlp.moe() ? max_of({NH + Kb + counts, NH + Kb + NE, NH + NH}) : NH + std::max(3 * NI, NH);
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
                                 DType dtype) {
  return largest_rank(degrees, [&](int r) {
    return workspace_on_rank(model, batch, seq_len, degrees, r, schedules, dtype);
  });
}

uint64_t attention_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, CheckpointSchedule checkpoint,
                         DType dtype) {
  return attention_phase_bytes(model, batch, seq_len, degrees, checkpoint, dtype).max();
}

uint64_t workspace_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, const SchedulesConfig& schedules,
                         DType dtype) {
  return workspace_phase_bytes(model, batch, seq_len, degrees, schedules, dtype).max();
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
