// The bytes of the two live sets the model itself allocates — `attention` and `workspace` —
// as closed-form functions of the model, the batch and the layout, derived line by line from
// DecoderModel (core/model/decoder.cpp, decoder_latent_attention.cpp) and the trainer's step
// (core/train/trainer.cpp). The planner (core/plan/plan.h, `moepeak plan`) sums these beside the
// schedules' own functions (ops/schedules/*_bytes), so the plan and the run share one source of
// truth.
//
// Test: ctest -R test_model_memory (one rank: the measured peak of each set in each phase EQUAL
// to these bytes, Mixtral, Qwen3-MoE and DeepSeek-V3 shapes); ctest -R 'test_plan' (tests/plan/:
// the same equality per phase on 1 to 8 ranks with Ulysses, beside every other set's bounds).
//
// With fp = DeviceArena::footprint, b = dtype bytes, N = B*T/W this rank's tokens, the heads and
// widths of the DecoderSpec's attention (nh, nkv, d the q/k heads' width, dv the value heads',
// = d for grouped-query attention; never ModelConfig::head_dim, which latent attention does not
// use), Qh/Kh/Vh/Oh the head layouts of q, k, v, out under UlyssesLayout over the Sp ranks of a
// sequence group (= the token layouts when Sp = 1), S the Ulysses staging (Sp > 1 only: the larger
// of ulysses_exchange_bytes of the q/k layout and the value layout, DecoderModel::ulysses_staging),
// l_res = L under checkpoint = "none", else 1:
//   attention: per resident layer Aa = fp(NHb) + fp(Nb) + X + fp(Q) + fp(K) + fp(V) + fp(O)
//              + fp(B h_q T b) [+ fp(O) the token-layout output, Sp > 1] with Q = N nh d b,
//              K = N nkv d b, V = N nkv dv b, O = N nh dv b (the head layouts under Sp > 1) and
//              X the kind's own kept: the q/k norm's inputs and rstds (qk_norm), or latent
//              attention's q latent, its norm and rstd (q_lora_rank > 0) and kv latent, its norm
//              and rstd; peak = (l_res - 1) Aa + the forward peak of one layer (Sp > 1: the
//              token-layout q, k, v and the staging beside the head-layout ones); in backward
//              Aa + S (and, checkpointing, the recompute's forward).
//   workspace: the batch (3 fp(8N) ids, labels, positions) + the largest moment of the step:
//              a layer's forward (its attention's temporaries — latent: q in the Hub's order,
//              the kv_a output, the rotary key, the kv_b output — then its residual h; the kept
//              MLP inputs: residual, norm, rstd, and probs, top-k, the shared experts' gate and up
//              (N, Is) x2 with their SwiGLU activation, plus the router logits (and a bf16
//              model's fp32 correction bias) before them, or a dense layer's gate and up (N, I) x2
//              and activation), the head (final norm, its rstd, their gradients), a layer's
//              backward (incoming gradient, dn2, the router's gradients, the shared experts'
//              SwiGLU gradients, dh, the attention gradients in both layouts and the kind's own:
//              latent, the rotary key's gradient, d kv_b, d latent, d kv_a, dq in the Hub's order,
//              d q latent; dn1, dx); with DeepSeek-V3's sequence-wise balance loss its gradient
//              (B_g, E) beside the router's and, Sp > 1, its sums' all-reduce (2 B_g E f64) at the
//              end of a MoE layer's forward, B_g the sequences of a sequence group; dense and MoE
//              layers mixed as the spec has them; the ZeRO-3
//              reduce-scatters run in place in the gathered grads and add nothing here.
// Each also per phase of the step (core/runtime/step_phase.h): the plan's total is its largest
// phase, each phase the sum of the sets live in it (live_in_phase for the schedules' sets).
#pragma once

#include <cstdint>

#include "core/config/config.h"
#include "core/model/parallel_layout.h"
#include "core/runtime/dtype.h"
#include "core/runtime/live_set.h"
#include "core/runtime/outside_arena.h"
#include "core/runtime/step_phase.h"

namespace moepeak {

// The communicators of more than one rank one rank of this layout holds (Comm's
// live_group_communicators): the world, the layout's splits (ParallelGroups: a group of one rank
// or of all makes none), ZeRO-3's traffic duplicates of the data-shard, expert-replica and
// dense-replica groups (zero_prefetch_depth >= 1), Ring-DTP's duplicate of the world, and
// PipelinedLLEP's two lanes over the expert group. On CUDA each is an NCCL communicator with
// buffers outside the arena (core/runtime/outside_arena.h). Test: test_plan_parallel counts them
// live on 2 and 4 ranks.
int model_group_communicators(const ParallelDegrees& d, const SchedulesConfig& s,
                              int64_t zero_prefetch_depth);

// A CUDA rank's device memory beside its arena in this run (cuda_outside_arena for the run's
// group communicators and its one GEMM stream): the plan's terms, and what `moepeak train` keeps
// free beside an "auto" arena.
OutsideArena model_outside_arena(const ParallelDegrees& d, const Config& cfg);

// Peak bytes of the `attention` live set on the largest rank for a global batch of B x T tokens
// in the layout `degrees` (Ulysses over the Sp ranks of a sequence group, B/(W/Sp) sequences
// each). `checkpoint` decides how many layers keep their attention activations at once.
uint64_t attention_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, CheckpointSchedule checkpoint,
                         DType dtype);

// Peak bytes of the `workspace` live set of one training step (forward, backward, grad norm,
// optimizer step, metrics) on the largest rank, including the trainer's batch tensors (with
// document_mask, training.document_mask, the sequence group's document starts: B/(W/Sp) x T i32).
uint64_t workspace_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                         const ParallelDegrees& degrees, const SchedulesConfig& schedules,
                         DType dtype, bool document_mask = false);

// The same per phase of the step (each the largest rank's in that phase; their max is the
// functions' above): attention holds a layer's kept activations beside its experts, and under
// checkpoint = "none" every layer's at the head; workspace splits its moments by phase.
PhaseBytes attention_phase_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                                 const ParallelDegrees& degrees, CheckpointSchedule checkpoint,
                                 DType dtype);
PhaseBytes workspace_phase_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len,
                                 const ParallelDegrees& degrees, const SchedulesConfig& schedules,
                                 DType dtype, bool document_mask = false);

// Whether a set its schedule sizes may hold bytes in `phase` of a step (the plan counts its whole
// term there, or nothing): the optimizer always when resident, else
// (the offloads' staging) in its own phase; dispatch in the experts phase, and under checkpoint =
// "none" (every layer keeping its dispatch for backward) in every layer's and the head's;
// logits at the head. Throws for the sets with bytes per phase of their own: attention and
// workspace (the functions above), weights and grads (zero_phase_gathered_bytes and the spill
// copies), boundaries (schedules::BoundariesBytes::phases). Test: test_plan (each phase's measured
// peak <= its plan).
bool live_in_phase(LiveSet set, StepPhase phase, const SchedulesConfig& schedules,
                   OptimizerPlacement placement);

// The same for every degree W.
inline uint64_t attention_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len, int world,
                                CheckpointSchedule checkpoint, DType dtype) {
  return attention_bytes(model, batch, seq_len, ParallelDegrees::uniform(world), checkpoint, dtype);
}
inline uint64_t workspace_bytes(const ModelConfig& model, int64_t batch, int64_t seq_len, int world,
                                const SchedulesConfig& schedules, DType dtype) {
  return workspace_bytes(model, batch, seq_len, ParallelDegrees::uniform(world), schedules, dtype);
}

}  // namespace moepeak
