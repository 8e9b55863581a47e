// The step-time model beside the memory plan (`moepeak plan --time`; docs/plan.md#step-time):
// what one optimizer step of a config costs on W ranks of a machine, per phase of the step
// (core/runtime/step_phase.h), from the FLOPs and bytes of each op class at the machine's rates
// and the bytes of each collective over the link its group crosses, less what the schedules hide.
//
//   MachineRates rates = machine_rates(cfg);            // probe file, device defaults, or the CPU
//   StepTime t = predict_step_time(cfg, make_plan(cfg, plan_inputs(cfg, W)), rates);
//   t.step_s, t.tokens_per_s, t.mfu, t.phase(StepPhase::backward_experts).exposed_comm_s
//
// Per micro-batch and rank (N = B T / W tokens; B_g = B / (W/Sp) sequences in the head layout):
//   dense GEMMs     2 N P_dense per pass: the attention projections, routers, dense MLPs and
//                   shared experts (their matmul parameters from the DecoderSpec) and the LM head
//                   (V H, or V/W H per Ring-DTP strip); passes: forward 1, backward 2, and 1 more
//                   forward when checkpointing recomputes each layer
//   expert GEMMs    2 N k 3 F H per MoE layer and pass (balanced routing: each rank's experts
//                   receive N k rows), at the grouped-GEMM rate
//   attention       forward 2 B_g (nh/Sp) (d + dv) pairs_l per layer, pairs_l = sum_t min(t+1, W_l)
//                   (every causal pair without a window); backward 2.5x forward (dQ, dK, dV and
//                   the recomputed QK^T); at the attention rate
//   elementwise     per token, layer and pass: kElementwiseBytesPerToken x H b (norms, RoPE,
//                   residuals, routing, permutes) + 3 F b per row the layer's SwiGLU activates
//                   (k per token in an MoE layer, plus a shared expert's, 1 in a dense MLP), at
//                   the elementwise rate; 4 V b per token at the head's loss, at the loss rate
//   optimizer       the rank's parameter shard x AdamW's bytes per parameter at the memory rate
//                   (resident), or over the host link and the host's memory rate (offloads)
//   launches        each op's fixed cost (MachineRates::op_latency_s) times the ops of a phase:
//                   kOpsPerLayer... in step_time.cpp, counted from the decoder's calls
// Collectives (bytes as core/plan/layout_search.h's step_traffic, per micro-batch): a ring over a
// group of G ranks costs (G-1)/G x bytes / bandwidth + (G - 1) latencies on the group's link — the
// node's link when the group's ranks share a node (runs of consecutive ranks; MachineRates::
// ranks_per_node), else the network's.
// What the schedules hide (exposed = what is left on the critical path):
//   ZeRO-3 gathers    prefetch depth >= 1: each layer's gather behind the layer before it
//                     (exposed max(0, gather - compute) per layer, the first layer's whole);
//                     depth 0: all exposed. Reduce-scatters likewise behind the next layer.
//   Ulysses, standard dispatch, LLEP: exposed (the compute waits for the exchange).
//   PipelinedLLEP     K chunks: exposed max(0, comm - compute) + comm / K (the first chunk).
//   Ring-DTP          W - 1 rounds: each round's send behind its strip's GEMM.
//   SCO               the boundary copies behind the layers' compute (exposed: the excess).
//   OffloadStreamAdamW   max(h2d, host AdamW, d2h) over the buckets; serial offload: their sum,
//                     the device idle meanwhile.
// What the model cannot see: contention between streams, stragglers, kernel selection at odd
// shapes, routing skew beyond a balanced split, the host's own scheduling.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/config/config.h"
#include "core/plan/layout_search.h"
#include "core/plan/plan.h"
#include "core/runtime/step_phase.h"

namespace moepeak {

// The rates of one rank's device and links. FLOP/s and bytes/s (1e9 bytes = 1 GB).
struct MachineRates {
  std::string name;               // "H200 (public ceilings)", "this machine (probe.toml)", ...
  std::string source;             // where the numbers come from, for the output
  double gemm_flops = 0;          // dense GEMM at the working dtype
  double grouped_gemm_flops = 0;  // the experts' grouped GEMMs
  double attention_flops = 0;     // flash attention, forward and backward
  double memory_bytes_per_s = 0;  // device memory streamed: resident AdamW
  // What the layers' elementwise ops (norms, RoPE, residuals, the SwiGLU, routing, permutes) and
  // the head's softmax cross-entropy achieve, in the model's byte counts (step_time.cpp): the
  // memory rate on a GPU; on a CPU, where the exponentials bound them, measured on the ops.
  double elementwise_bytes_per_s = 0;
  double loss_bytes_per_s = 0;
  double host_link_bytes_per_s = 0;    // pinned host <-> device, each way
  double host_memory_bytes_per_s = 0;  // the host's AdamW over its pinned state
  double node_link_bytes_per_s = 0;    // a collective's bus bandwidth within a node
  double node_link_latency_s = 0;
  double network_bytes_per_s = 0;  // between nodes, per rank
  double network_latency_s = 0;
  int ranks_per_node = 1;
  double peak_flops = 0;  // for MFU: the device's dense peak at the working dtype
  // What one op costs beyond its work: the CPU stream's hand-off to its worker and back, a GPU
  // kernel's launch (0: not modelled).
  double op_latency_s = 0;
};

// The elementwise accounting the model and the rates' measurement (core/measure/machine_measure.h)
// share, in working-dtype bytes per element: the SwiGLU's forward reads a and b and writes h (3
// per element of h; a backward counts as 2 forwards); the loss's forward and backward read and
// write each logit (4 per logit for both).
inline constexpr double kSwigluBytesPerElement = 3.0;
inline constexpr double kLossBytesPerLogit = 4.0;

// One phase of the step, summed over its layers and the step's micro-batches.
struct PhaseTime {
  StepPhase phase = StepPhase::embedding;
  double gemm_s = 0, grouped_gemm_s = 0, attention_s = 0, elementwise_s = 0, optimizer_s = 0;
  double launch_s = 0;        // the phase's ops x MachineRates::op_latency_s
  double comm_s = 0;          // every collective of the phase, as if alone
  double exposed_comm_s = 0;  // what the schedules leave on the critical path
  double compute_s() const {
    return gemm_s + grouped_gemm_s + attention_s + elementwise_s + optimizer_s + launch_s;
  }
  double time_s() const { return compute_s() + exposed_comm_s; }
  // What bounds the phase: "gemm", "grouped_gemm", "attention", "elementwise", "optimizer" or
  // the collective with the most exposed time ("zero3", "ulysses", "dispatch", "vocab",
  // "replicas", "offload").
  std::string bound;
};

struct StepTime {
  MachineRates rates;
  int world = 1;
  std::array<PhaseTime, kNumStepPhases> phases{};  // kAllStepPhases order
  double step_s = 0;
  double tokens_per_s = 0;  // B T m / step_s
  double flops = 0;         // the model FLOPs of the step (core/metrics/flops.h)
  double mfu = 0;           // flops / (step_s W peak_flops)
  const PhaseTime& phase(StepPhase p) const { return phases[static_cast<size_t>(p)]; }
};

// `plan`: make_plan's for `cfg` (its inputs are the step's shape and layout — cfg.parallelism's
// degrees are not read; SCO's offloaded layers come from it). Throws moepeak::Error (naming the
// rate) unless every rate the config needs is positive.
StepTime predict_step_time(const Config& cfg, const Plan& plan, const MachineRates& rates);

// `moepeak plan --search-layout --time`: every row that fits gets its predicted step_s (the
// others keep 0), the rows are ordered fastest first (those that do not fit after, in their
// order), and `best` is the fastest that fits (-1 when none does). `cfg`: the config searched.
void order_layouts_by_step_time(const Config& cfg, LayoutSearch& search, const MachineRates& rates);

}  // namespace moepeak
