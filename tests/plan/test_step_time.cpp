// The step-time model (core/plan/step_time.h) as arithmetic: each op class's time is its FLOPs or
// bytes over its rate (a rate doubled halves it), the model FLOPs equal core/metrics/flops.h's,
// the schedules hide what they should (ZeRO-3 prefetch, PipelinedLLEP's chunks, the offloads'
// streams), a group that crosses nodes pays the network, m micro-batches cost m times a
// micro-batch plus one optimizer step, a missing rate is an error naming it, and a probe file's
// [rates] become the machine's rates only for the backend and dtype they were measured for. How
// well the model predicts a measured step is a benchmark, not a test (docs/perf.md#step-time). Run:
// ctest -R test_step_time
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/plan/machine_rates.h"
#include "core/plan/plan.h"
#include "core/plan/step_time.h"
#include "tests/expect_contains.h"
#include "topology/probe_file.h"

namespace moepeak {
namespace {

using test_support::error_of;

// Round rates of a made-up machine: every op class and link slow enough to matter.
MachineRates round_rates() {
  MachineRates r;
  r.name = "test machine";
  r.source = "the test";
  r.gemm_flops = 1e12;
  r.grouped_gemm_flops = 5e11;
  r.attention_flops = 4e11;
  r.memory_bytes_per_s = 1e11;
  r.elementwise_bytes_per_s = 8e10;
  r.loss_bytes_per_s = 6e10;
  r.host_link_bytes_per_s = 2e10;
  r.host_memory_bytes_per_s = 5e10;
  r.node_link_bytes_per_s = 1e11;
  r.node_link_latency_s = 5e-6;
  r.network_bytes_per_s = 1e10;
  r.network_latency_s = 2e-5;
  r.ranks_per_node = 8;
  r.peak_flops = 2e12;
  return r;
}

// A small model at a shape where every term is non-zero.
Config model_config(int world) {
  Config c;
  c.model.vocab_size = 1000;
  c.model.hidden_size = 256;
  c.model.intermediate_size = 512;
  c.model.num_hidden_layers = 4;
  c.model.num_attention_heads = 8;
  c.model.num_key_value_heads = 4;
  c.model.head_dim = 32;
  c.model.num_local_experts = 8;
  c.model.num_experts_per_tok = 2;
  c.model.max_position_embeddings = 4096;
  c.training.batch_size = world;
  c.training.seq_len = 2048;
  c.runtime.device_memory = "64GiB";
  c.runtime.pinned_memory = "64GiB";
  return c;
}

StepTime predict(const Config& c, int world, const MachineRates& r = round_rates()) {
  return predict_step_time(c, make_plan(c, plan_inputs(c, world)), r);
}

double total(const StepTime& t, double PhaseTime::*field) {
  double s = 0;
  for (const PhaseTime& p : t.phases) s += p.*field;
  return s;
}

TEST(StepTime, EachClassIsItsWorkOverItsRate) {
  const Config c = model_config(1);
  const StepTime base = predict(c, 1);
  EXPECT_GT(base.step_s, 0);
  for (const PhaseTime& p : base.phases) {
    EXPECT_NEAR(p.time_s(), p.compute_s() + p.exposed_comm_s, 1e-15);
    EXPECT_LE(p.exposed_comm_s, p.comm_s + 1e-15) << "exposed is part of the collectives' time";
  }
  EXPECT_EQ(total(base, &PhaseTime::comm_s), 0) << "one rank: no collective";
  MachineRates fast = round_rates();
  fast.gemm_flops *= 2;
  const StepTime t = predict(c, 1, fast);
  EXPECT_NEAR(total(t, &PhaseTime::gemm_s), total(base, &PhaseTime::gemm_s) / 2, 1e-12);
  EXPECT_EQ(total(t, &PhaseTime::attention_s), total(base, &PhaseTime::attention_s));
  EXPECT_LT(t.step_s, base.step_s);
  // The model FLOPs are flops.h's (its attention counts T^2 / 2 pairs, this T (T + 1) / 2).
  EXPECT_NEAR(base.flops / step_flops(c.model, 1, 2048), 1.0, 1e-3);
  EXPECT_NEAR(base.tokens_per_s, 2048 / base.step_s, 1e-9 * base.tokens_per_s);
  EXPECT_NEAR(base.mfu, base.flops / (base.step_s * 2e12), 1e-12);
}

// The layers' elementwise work at the elementwise rate, the head's loss at the loss rate; the
// SwiGLU's share grows with the experts' width and lands in the expert phases only.
TEST(StepTime, ElementwiseAndLossEachAtTheirRate) {
  const Config c = model_config(1);
  const StepTime base = predict(c, 1);
  const StepPhase head = StepPhase::head;
  MachineRates fast = round_rates();
  fast.elementwise_bytes_per_s *= 2;
  const StepTime e = predict(c, 1, fast);
  for (size_t i = 0; i < kNumStepPhases; ++i) {
    const double want = base.phases[i].phase == head ? base.phases[i].elementwise_s
                                                     : base.phases[i].elementwise_s / 2;
    EXPECT_NEAR(e.phases[i].elementwise_s, want, 1e-15) << i;
  }
  fast = round_rates();
  fast.loss_bytes_per_s *= 2;
  const StepTime l = predict(c, 1, fast);
  EXPECT_NEAR(l.phase(head).elementwise_s, base.phase(head).elementwise_s / 2, 1e-15);
  // 4 V b per token: N = 2048 tokens, V = 1000, f32, at 6e10 B/s.
  EXPECT_NEAR(base.phase(head).elementwise_s, 4.0 * 2048 * 1000 * 4 / 6e10, 1e-15);
  Config wide = c;
  wide.model.intermediate_size *= 2;
  const StepTime w = predict(wide, 1);
  const auto fa = StepPhase::forward_attention, fe = StepPhase::forward_experts;
  EXPECT_EQ(w.phase(fa).elementwise_s, base.phase(fa).elementwise_s);
  // The forward MLP's elementwise grows by the SwiGLU's 3 F k b per token and layer: 4 layers,
  // k = 2, F 512 more, at 8e10 B/s.
  EXPECT_NEAR(w.phase(fe).elementwise_s - base.phase(fe).elementwise_s,
              2048 * 4 * 3.0 * 2 * 512 * 4 / 8e10, 1e-12);
}

TEST(StepTime, ASlidingWindowCutsTheAttentionTime) {
  Config c = model_config(1);
  c.model.model_type = ModelType::gpt_oss;
  c.model.attention_bias = true;
  c.model.sliding_window = 0;
  c.model.layer_types.assign(4, AttentionLayerType::full_attention);
  const StepTime full = predict(c, 1);
  c.model.sliding_window = 128;
  c.model.layer_types.assign(4, AttentionLayerType::sliding_attention);
  const StepTime windowed = predict(c, 1);
  const double T = 2048, W = 128;
  const double share = (W * (W + 1) / 2 + (T - W) * W) / (T * (T + 1) / 2);
  EXPECT_NEAR(total(windowed, &PhaseTime::attention_s) / total(full, &PhaseTime::attention_s),
              share, 1e-12);
}

TEST(StepTime, PrefetchHidesTheGathersAndANodeBoundaryCosts) {
  Config c = model_config(8);
  c.parallelism.zero_prefetch_depth = 0;
  const StepTime exposed = predict(c, 8);
  c.parallelism.zero_prefetch_depth = 1;
  const StepTime hidden = predict(c, 8);
  const PhaseTime& e = exposed.phase(StepPhase::forward_attention);
  const PhaseTime& h = hidden.phase(StepPhase::forward_attention);
  EXPECT_EQ(e.comm_s, h.comm_s);
  EXPECT_LT(h.exposed_comm_s, e.exposed_comm_s);
  // Eight ranks on one node, then four per node: every group of 8 crosses the network.
  MachineRates four = round_rates();
  four.ranks_per_node = 4;
  const StepTime split = predict(c, 8, four);
  EXPECT_GT(split.phase(StepPhase::forward_experts).comm_s,
            hidden.phase(StepPhase::forward_experts).comm_s);
  EXPECT_GT(split.step_s, hidden.step_s);
}

TEST(StepTime, PipelinedLlepHidesDispatchBehindTheExperts) {
  Config c = model_config(8);
  const StepTime standard = predict(c, 8);
  c.schedules.dispatch = DispatchSchedule::pipelined_llep;
  c.schedules.chunk_tokens = 256;
  const StepTime pipelined = predict(c, 8);
  const PhaseTime& s = standard.phase(StepPhase::forward_experts);
  const PhaseTime& p = pipelined.phase(StepPhase::forward_experts);
  EXPECT_EQ(s.exposed_comm_s, s.comm_s) << "the standard dispatch waits for its all-to-all";
  EXPECT_LT(p.exposed_comm_s, s.exposed_comm_s);
}

TEST(StepTime, TheStreamedOffloadOverlapsWhatTheSerialOneAdds) {
  Config c = model_config(1);
  c.optimizer.placement = OptimizerPlacement::offload_serial;
  const double serial = predict(c, 1).phase(StepPhase::optimizer).optimizer_s;
  c.optimizer.placement = OptimizerPlacement::offload_stream;
  const double streamed = predict(c, 1).phase(StepPhase::optimizer).optimizer_s;
  EXPECT_LT(streamed, serial);
  EXPECT_GT(streamed, serial / 3 - 1e-15) << "the largest of the three streams";
}

TEST(StepTime, MicroBatchesRepeatTheStepButNotTheOptimizer) {
  Config c = model_config(1);
  const StepTime one = predict(c, 1);
  c.training.grad_accum_steps = 4;
  const StepTime four = predict(c, 1);
  for (StepPhase p : kAllStepPhases) {
    if (p == StepPhase::optimizer) {
      EXPECT_EQ(four.phase(p).time_s(), one.phase(p).time_s());
    } else {
      EXPECT_NEAR(four.phase(p).time_s(), 4 * one.phase(p).time_s(), 1e-12);
    }
  }
  EXPECT_NEAR(four.flops, 4 * one.flops, 1e-6 * four.flops);
}

TEST(StepTime, AMissingRateIsAnErrorNamingIt) {
  MachineRates r = round_rates();
  r.attention_flops = 0;
  EXPECT_CONTAINS(error_of([&] { predict(model_config(1), 1, r); }),
                  "test machine has no attention rate");
  Config c = model_config(1);
  c.optimizer.placement = OptimizerPlacement::offload_stream;
  MachineRates no_host = round_rates();
  no_host.host_link_bytes_per_s = 0;
  EXPECT_CONTAINS(error_of([&] { predict(c, 1, no_host); }), "no host link bandwidth");
  EXPECT_CONTAINS(error_of([] { device_rates("a100", DType::bf16); }),
                  "no step-time defaults for device \"a100\"; known: h100, h200");
  const MachineRates h200 = device_rates("h200", DType::bf16);
  EXPECT_GT(h200.memory_bytes_per_s, device_rates("h100", DType::bf16).memory_bytes_per_s);
  EXPECT_EQ(h200.ranks_per_node, 8);
}

// A probe with [rates] as `moepeak probe --cpu -n 2` writes them (numbers by hand).
topology::ProbeResult probe_with_rates(const std::string& backend, const std::string& dtype) {
  topology::ProbeResult p;
  p.host = "node07";
  p.date = "2026-12-07 10:00:00 UTC";
  p.budgets.ranks_per_node = 2;
  p.rates_measured = true;
  p.rates = {backend,
             backend == "cuda" ? "NVIDIA H100 80GB HBM3" : "cpu (2 cores)",
             dtype,
             2,
             "hidden 64, from the test",
             1.5e10,
             2.5e10,
             3.5e10,
             4.5e10,
             4.25e10,
             4.125e10,
             5.5e10,
             6.5e10,
             7.5e-7,
             8.5e10};
  return p;
}

TEST(MachineRates, FromTheProbeFileTheirBackendAndDtypeOnly) {
  RuntimeConfig cpu;
  cpu.backend = BackendChoice::cpu;
  const topology::ProbeResult p = probe_with_rates("cpu", "f32");
  const MachineRates r = rates_from_probe(p, "probe/node07.toml", cpu, DType::f32);
  EXPECT_EQ(r.name, "this machine (probe/node07.toml)");
  EXPECT_CONTAINS(r.source, "node07, 2026-12-07 10:00:00 UTC, at hidden 64, from the test");
  // Every measured number as written (bitwise: nothing is computed from them).
  EXPECT_EQ(r.gemm_flops, 1.5e10);
  EXPECT_EQ(r.grouped_gemm_flops, 2.5e10);
  EXPECT_EQ(r.attention_flops, 3.5e10);
  EXPECT_EQ(r.memory_bytes_per_s, 4.5e10);
  EXPECT_EQ(r.elementwise_bytes_per_s, 4.25e10);
  EXPECT_EQ(r.loss_bytes_per_s, 4.125e10);
  EXPECT_EQ(r.host_link_bytes_per_s, 5.5e10);
  EXPECT_EQ(r.host_memory_bytes_per_s, 6.5e10);
  EXPECT_EQ(r.op_latency_s, 7.5e-7);
  EXPECT_EQ(r.peak_flops, 8.5e10);
  EXPECT_EQ(r.ranks_per_node, 2);
  // The CPU's links: the host's shared memory (half its memcpy rate), or the link model.
  EXPECT_EQ(r.node_link_bytes_per_s, 6.5e10 / 2);
  EXPECT_EQ(r.network_bytes_per_s, 6.5e10 / 2);
  cpu.cpu_link_gb_per_s = 3;
  cpu.cpu_link_latency_us = 20;
  const MachineRates modelled = rates_from_probe(p, "p.toml", cpu, DType::f32);
  EXPECT_EQ(modelled.node_link_bytes_per_s, 3e9);
  EXPECT_EQ(modelled.node_link_latency_s, 20 * 1e-6);  // set_cpu_links: us x 1e-6
  EXPECT_EQ(modelled.ranks_per_node, 2);
  // "auto" is priced as the CPU.
  RuntimeConfig any;
  any.backend = BackendChoice::automatic;
  EXPECT_EQ(probe_rates_unusable(p, "p.toml", any, DType::f32), "");

  // Another dtype, another backend, no [rates]: the file, what it has, the command.
  std::string e = error_of([&] { rates_from_probe(p, "p.toml", cpu, DType::bf16); });
  EXPECT_CONTAINS(e, "p.toml has no rates for bf16 on cpu (it has f32 on cpu; re-run ");
  EXPECT_CONTAINS(e, "`moepeak probe --cpu -n 2 --set training.dtype=bfloat16 -o p.toml`");
  EXPECT_EQ(probe_rates_unusable(p, "p.toml", cpu, DType::bf16), e);
  RuntimeConfig cuda;
  cuda.backend = BackendChoice::cuda;
  e = error_of([&] { rates_from_probe(p, "p.toml", cuda, DType::f32); });
  EXPECT_CONTAINS(e, "p.toml has no rates for f32 on cuda (it has f32 on cpu; ");
  EXPECT_CONTAINS(e, "`moepeak probe -n 2 --set training.dtype=float32 -o p.toml`");
  topology::ProbeResult none = p;
  none.rates_measured = false;
  EXPECT_CONTAINS(error_of([&] { rates_from_probe(none, "p.toml", cpu, DType::f32); }),
                  "p.toml has no rates for f32 on cpu (it has none: written with --no-bench");

  // A GPU's: an H100's documented links stand in for the ones the probe does not measure.
  const MachineRates gpu =
      rates_from_probe(probe_with_rates("cuda", "bf16"), "p.toml", cuda, DType::bf16);
  const MachineRates h100 = device_rates("h100", DType::bf16);
  EXPECT_EQ(gpu.gemm_flops, 1.5e10);
  EXPECT_EQ(gpu.node_link_bytes_per_s, h100.node_link_bytes_per_s);
  EXPECT_EQ(gpu.network_bytes_per_s, h100.network_bytes_per_s);
  EXPECT_EQ(gpu.ranks_per_node, 2);
  EXPECT_CONTAINS(gpu.source, "links: H100 SXM (public ceilings) defaults");
  topology::ProbeResult other = probe_with_rates("cuda", "bf16");
  other.rates.device = "NVIDIA A100-SXM4-80GB";
  EXPECT_EQ(rates_from_probe(other, "p.toml", cuda, DType::bf16).node_link_bytes_per_s, 0);
}

}  // namespace
}  // namespace moepeak
