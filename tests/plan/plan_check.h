// Shared by test_plan.cpp (one rank) and test_plan_parallel.cpp (2 and 4 ranks under mpirun):
// trains a few real steps with the Trainer (CPU backend, f32) and holds the measured peak of
// every live set to the plan of the same config (core/plan/plan.h):
//   measured <= planned                       for every set, on every rank, and the host terms;
//   planned  <= 1.10 x measured               for every set except the documented router-
//                                             dependent bounds (standard expert-parallel and
//                                             LLEP dispatch, which the plan takes at their worst
//                                             case R, and LLEP's spill copies in weights/grads;
//                                             docs/plan.md), which have only the first;
//   measured phase peak <= the phase's total  for every phase of the step (docs/plan.md#phases),
//   measured set peak <= its phase's bytes    for every set in every phase, on every rank (the
//                                             plan's per-phase bytes of each set are bounds of
//                                             their own),
//   ... and == for the model's own sets       attention and workspace (decoder_memory.h's
//                                             functions are exact),
//   measured total peak <= planned total      (the largest phase),
//   arena high water    <= planned total      (so is it of the allocator's fragmentation),
//   live communicators  == the plan's count   (its NCCL term's, on CUDA).
// Rank 0 prints "ratio <case> <set> planned measured planned/measured" lines (docs/plan.md).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/decoder_memory.h"
#include "core/plan/plan.h"
#include "core/train/trainer.h"
#include "ops/schedules/llep_experts.h"

namespace moepeak::test_support {

// A tiny model and batch (four ranks share two cores).
inline Config tiny_plan_config() {
  Config c;
  c.model.vocab_size = 96;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 48;
  c.model.num_hidden_layers = 3;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.head_dim = 8;
  c.model.num_local_experts = 4;
  c.model.num_experts_per_tok = 2;
  c.model.max_position_embeddings = 128;
  c.training.batch_size = 2;
  c.training.seq_len = 48;
  c.training.steps = 2;
  c.metrics.progress = ProgressMode::off;
  c.runtime.device_memory = "256MiB";
  c.runtime.pinned_memory = "64MiB";
  c.runtime.threads = 1;
  c.optimizer.bucket_params = 4096;
  c.optimizer.staging_slots = 2;
  return c;
}

// The tiny config as a DeepSeek-V3: latent attention (q/k heads of 8 + 4, value heads of 6, a
// query bottleneck of 16 and a key/value latent of 20), a dense first layer, sigmoid
// group-limited routing with its correction bias, shared experts of twice the experts' width.
inline void deepseek_v3_parts(Config& c) {
  c.model.model_type = ModelType::deepseek_v3;
  c.model.moe_intermediate_size = 12;
  c.model.num_key_value_heads = 4;
  c.model.q_lora_rank = 16;
  c.model.kv_lora_rank = 20;
  c.model.qk_nope_head_dim = 8;
  c.model.qk_rope_head_dim = 4;
  c.model.v_head_dim = 6;
  c.model.head_dim = 12;
  c.model.num_local_experts = 8;
  c.model.n_group = 4;
  c.model.topk_group = 2;
  c.model.routed_scaling_factor = 2.5;
  c.model.n_shared_experts = 2;
  c.model.first_k_dense_replace = 1;
  c.model.rope_interleave = true;
}

// Whether `set` is one of the worst-case (router-dependent) bounds that need not be tight.
// Expert-parallel (W > 1) standard and LLEP dispatch: R taken at its worst case (W*N*k, R_cap);
// under checkpoint = "none" the all-at-once dispatchers (EP, LLEP) are L times the one-layer bound
// (their functions have no count of resident layers; StandardDispatch's has, and is exact).
// LLEP's spill copies (W > 1, lambda <= W): weights and grads take the worst case of
// llep_spill_copy_bytes (min(E - E/W, plans * capacity) foreign experts per rank), which a given
// router reaches only by chance.
inline bool loose_by_design(const Config& c, int world, LiveSet set) {
  if ((set == LiveSet::weights || set == LiveSet::grads) && world > 1 &&
      (c.schedules.dispatch == DispatchSchedule::llep ||
       c.schedules.dispatch == DispatchSchedule::pipelined_llep) &&
      schedules::llep_may_spill(world, {c.schedules.llep_alpha, c.schedules.llep_lambda,
                                        c.schedules.min_tokens_per_gemm})) {
    return true;
  }
  if (set != LiveSet::dispatch || c.schedules.dispatch == DispatchSchedule::pipelined_llep)
    return false;
  return world > 1 || (c.schedules.dispatch == DispatchSchedule::llep &&
                       c.schedules.checkpoint == CheckpointSchedule::none);
}

// Returns this rank's measured per-set device peaks.
inline MemorySnapshot expect_within_plan(const std::string& name, const Config& cfg) {
  Trainer trainer(cfg, TrainOptions{});
  MemorySnapshot device, host;
  uint64_t total = 0, high_water = 0;
  PhaseBytes phases;
  std::array<MemorySnapshot, kNumStepPhases> phase_sets{};       // the sets at each phase's peak
  std::array<MemorySnapshot, kNumStepPhases> phase_set_peaks{};  // each set's own, per phase
  for (int64_t i = 0; i < cfg.training.steps; ++i) {
    const StepMetrics m = trainer.step();
    for (StepPhase ph : kAllStepPhases) {
      if (m.phase_peaks[ph] <= phases[ph]) continue;
      phases[ph] = m.phase_peaks[ph];
      phase_sets[static_cast<size_t>(ph)] = m.phase_at_peak[static_cast<size_t>(ph)];
    }
    for (size_t s = 0; s < kNumLiveSets; ++s) {
      for (size_t ph = 0; ph < kNumStepPhases; ++ph) {
        uint64_t& peak = phase_set_peaks[ph].bytes[s];
        peak = std::max(peak, m.phase_peak_per_set[ph].bytes[s]);
      }
      device.bytes[s] = std::max(device.bytes[s], m.peak_per_set.bytes[s]);
      host.bytes[s] = std::max(host.bytes[s], m.host_peak_per_set.bytes[s]);
    }
    total = std::max(total, m.peak_total);
    high_water = std::max(high_water, m.arena_high_water);
  }
  const int W = trainer.world_size();
  const Plan plan = make_plan(cfg, plan_inputs(cfg, W));
  // The communicators of more than one rank the run holds, which the plan's NCCL term counts on
  // CUDA (MPI's here, made at the same places).
  EXPECT_EQ(live_group_communicators(),
            model_group_communicators(plan.inputs.degrees, cfg.schedules,
                                      cfg.parallelism.zero_prefetch_depth))
      << name << " W=" << W << " (" << plan.inputs.degrees.str() << ")";
  for (LiveSet s : kAllLiveSets) {
    const uint64_t planned = plan.term(s).bytes, measured = device[s];
    const std::string what = name + " W=" + std::to_string(W) + " rank " +
                             std::to_string(trainer.rank()) + " " + std::string(live_set_name(s)) +
                             " (" + plan.term(s).function + ")";
    EXPECT_LE(measured, planned) << what;
    if (!loose_by_design(cfg, W, s)) {
      EXPECT_LE(static_cast<double>(planned), 1.10 * static_cast<double>(measured)) << what;
    }
    if (trainer.rank() == 0) {
      std::printf("ratio %s W=%d %-10s planned %9llu measured %9llu planned/measured %.4f%s\n",
                  name.c_str(), W, std::string(live_set_name(s)).c_str(),
                  static_cast<unsigned long long>(planned),
                  static_cast<unsigned long long>(measured),
                  measured ? static_cast<double>(planned) / static_cast<double>(measured) : 1.0,
                  loose_by_design(cfg, W, s) ? " (worst-case bound)" : "");
    }
  }
  for (StepPhase ph : kAllStepPhases) {
    const uint64_t planned = plan.phase(ph).total, measured = phases[ph];
    std::string sets;  // measured/planned per set at the phase's peak, for a failure
    for (LiveSet s : kAllLiveSets) {
      sets += " " + std::string(live_set_name(s)) + " " +
              std::to_string(phase_sets[static_cast<size_t>(ph)][s]) + "/" +
              std::to_string(plan.phase(ph)[s]);
    }
    EXPECT_LE(measured, planned) << name << " W=" << W << " rank " << trainer.rank() << " phase "
                                 << step_phase_name(ph) << ": measured/planned" << sets;
    if (trainer.rank() == 0) {
      std::printf("phase %s W=%d %-10s planned %9llu measured %9llu planned/measured %.4f%s\n",
                  name.c_str(), W, std::string(step_phase_name(ph)).c_str(),
                  static_cast<unsigned long long>(planned),
                  static_cast<unsigned long long>(measured),
                  measured ? static_cast<double>(planned) / static_cast<double>(measured) : 1.0,
                  ph == plan.peak_phase ? " (the plan's peak)" : "");
    }
  }
  for (StepPhase ph : kAllStepPhases) {
    for (LiveSet set : kAllLiveSets) {
      const uint64_t measured = phase_set_peaks[static_cast<size_t>(ph)][set];
      const uint64_t planned = plan.phase(ph)[set];
      const std::string what =
          name + " W=" + std::to_string(W) + " rank " + std::to_string(trainer.rank()) + " " +
          std::string(live_set_name(set)) + " in phase " + std::string(step_phase_name(ph));
      EXPECT_LE(measured, planned) << what;
      if (set == LiveSet::attention || set == LiveSet::workspace) {
        EXPECT_EQ(measured, planned) << what;
      }
    }
  }
  EXPECT_LE(total, plan.total) << name;
  // The arena's fragmentation (its highest block end past the live bytes at the peak) fits in
  // the slack of the plan's largest phase: a capacity of plan.total holds the run.
  EXPECT_GE(high_water, total) << name;
  EXPECT_LE(high_water, plan.total) << name << ": the arena reached " << high_water;
  if (trainer.rank() == 0) {
    const uint64_t transient = plan.phase(plan.peak_phase).total - plan.setup;
    std::printf(
        "fragmentation %s W=%d peak %llu high_water %llu (+%.2f%%, %.2f%% of the plan's "
        "%llu transient) plan total %llu\n",
        name.c_str(), W, static_cast<unsigned long long>(total),
        static_cast<unsigned long long>(high_water),
        total ? 100.0 * static_cast<double>(high_water - total) / total : 0.0,
        transient ? 100.0 * static_cast<double>(high_water - total) / transient : 0.0,
        static_cast<unsigned long long>(transient), static_cast<unsigned long long>(plan.total));
  }
  // Host (pinned pool): SCO's block in `boundaries`, the optimizer state in `optimizer`, the
  // serial offload's gradient copy in `grads` and, with bf16 weights, its weight copy in
  // `weights`.
  uint64_t sco = 0, state = 0, grad_copy = 0, weight_copy = 0;
  for (const HostTerm& h : plan.host) {
    if (h.name == "sco_boundaries") sco = h.bytes;
    if (h.name == "optimizer_state") state = h.bytes;
    if (h.name == "optimizer_grad_copy") grad_copy = h.bytes;
    if (h.name == "optimizer_weight_copy") weight_copy = h.bytes;
  }
  EXPECT_EQ(host[LiveSet::boundaries], sco) << name << " host sco boundaries";
  EXPECT_EQ(host[LiveSet::optimizer], state) << name << " host optimizer state";
  EXPECT_EQ(host[LiveSet::grads], grad_copy) << name << " host gradient copy";
  EXPECT_EQ(host[LiveSet::weights], weight_copy) << name << " host weight copy";
  EXPECT_TRUE(plan.fits()) << plan.verdict();
  return device;
}

}  // namespace moepeak::test_support
