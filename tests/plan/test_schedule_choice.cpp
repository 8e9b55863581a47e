// The live sets' choice points (ops/schedules/{dispatch,vocab,checkpoint,optimizer}_choice.h)
// against the per-schedule functions they stand for, for every schedule of each live set on
// W = 1 and W = 4: the choice's bytes equal the schedule's own bytes function (standard dispatch
// on W > 1 at its worst case R = W*N*k, ...), make_plan's term is exactly the choice's (bytes,
// formula, schedule name), and on one rank make_* returns the object of that same schedule. Any
// drift between what the model runs and what the planner counts fails here.
// Run: ctest -R test_schedule_choice --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>

#include "core/comm/single_comm.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/plan/plan.h"
#include "core/runtime/arena.h"
#include "core/runtime/backend.h"
#include "core/runtime/pinned_pool.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/checkpoint_sco.h"
#include "ops/schedules/dispatch_choice.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/optimizer_choice.h"
#include "ops/schedules/vocab_choice.h"
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"
#include "ops/swiglu.h"
#include "tests/expect_contains.h"
#include "tests/plan/plan_check.h"

namespace moepeak {
namespace {

using test_support::tiny_plan_config;

constexpr DType kDtype = DType::f32;  // the tiny config on the CPU trains in float32

// The tiny plan config with PipelinedLLEP chunking its 96 tokens on one rank.
Config choice_config() {
  Config c = tiny_plan_config();
  c.schedules.chunk_tokens = 24;
  return c;
}

// N = B*T/W, the tokens of each rank.
int64_t tokens_of(const Config& c, int world) {
  return c.training.batch_size * c.training.seq_len / world;
}

// One rank's CPU backend, its stream and a single-rank communicator, for make_*.
struct OneRank {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  SingleComm comm{BackendKind::cpu};
};

template <typename T>
std::string name_of(T value) {
  return std::string(enum_name(value));
}

void expect_term(const Plan& plan, LiveSet set, const schedules::ScheduleBytes& choice) {
  const PlanTerm& t = plan.term(set);
  EXPECT_EQ(t.bytes, choice.bytes) << live_set_name(set);
  EXPECT_EQ(t.function, choice.function) << live_set_name(set);
  EXPECT_EQ(t.schedule, choice.schedule) << live_set_name(set);
}

// ---- dispatch ----------------------------------------------------------------------------------

using DispatchCase = std::tuple<DispatchSchedule, int, CheckpointSchedule>;

class DispatchChoice : public testing::TestWithParam<DispatchCase> {};

TEST_P(DispatchChoice, BytesObjectAndPlanAgree) {
  const auto [schedule, W, checkpoint] = GetParam();
  Config c = choice_config();
  c.schedules.dispatch = schedule;
  c.schedules.checkpoint = checkpoint;
  const SchedulesConfig& s = c.schedules;
  const ModelConfig& m = c.model;
  const int64_t N = tokens_of(c, W), k = m.num_experts_per_tok, H = m.hidden_size;
  const int64_t F = m.intermediate_size, E = m.num_local_experts, L = m.num_hidden_layers;
  const int64_t layers = checkpoint == CheckpointSchedule::none ? L : 1;
  EXPECT_EQ(schedules::resident_layers(checkpoint, L), layers);
  const schedules::DispatchShape shape{N, k, H, F, E, W, layers, kDtype};
  const schedules::LlepParams lp{s.llep_alpha, s.llep_lambda, s.min_tokens_per_gemm};
  const auto pp = schedules::pipelined_llep_params(s);

  // The per-schedule functions, called directly.
  schedules::DispatchKind kind{};
  uint64_t bytes = 0, workspace = 0;
  const char* function = nullptr;
  bool spills = false;
  int64_t capacity = 0, plans = 0, spill_layers = 1;
  switch (schedule) {
    case DispatchSchedule::standard:
      if (W == 1) {
        kind = schedules::DispatchKind::standard;
        bytes = schedules::dispatch_standard_bytes(N, k, H, F, kDtype, layers);
        function = "dispatch_standard_bytes(";
      } else {
        kind = schedules::DispatchKind::expert_parallel;
        bytes = static_cast<uint64_t>(layers) *
                schedules::dispatch_expert_parallel_bytes(N, k, H, F, kDtype, W * N * k);
        function = "dispatch_expert_parallel_bytes(";
        workspace = DeviceArena::footprint(static_cast<uint64_t>(3 * E * 8));
      }
      break;
    case DispatchSchedule::llep:
      kind = schedules::DispatchKind::llep;
      bytes =
          static_cast<uint64_t>(layers) * schedules::llep_dispatch_bytes(N, k, H, F, kDtype, W, lp);
      function = "llep_dispatch_bytes(";
      workspace = DeviceArena::footprint(static_cast<uint64_t>((W + 1) * (E + 1) * 8));
      spills = W > 1;
      capacity = std::max<int64_t>(1, schedules::llep_receive_capacity(N * k, W, lp));
      plans = 1;
      spill_layers = layers;
      break;
    case DispatchSchedule::pipelined_llep: {
      kind = schedules::DispatchKind::pipelined_llep;
      bytes = schedules::pipelined_llep_dispatch_bytes(N, k, H, F, kDtype, W, pp);
      function = "pipelined_llep_dispatch_bytes(";
      const auto ps = schedules::pipelined_llep_shape(N, k, W, pp);
      // The count exchange: every rank's [N, counts padded to K_max chunks].
      workspace =
          DeviceArena::footprint(static_cast<uint64_t>((W + 1) * (1 + pp.max_chunks * E) * 8));
      spills = W > 1;
      capacity = std::max<int64_t>(1, ps.receive_rows);
      plans = ps.chunks;
      break;
    }
  }

  EXPECT_EQ(schedules::dispatch_kind(schedule, W), kind);
  const schedules::ScheduleBytes choice = schedules::dispatch_bytes(s, shape);
  EXPECT_EQ(choice.bytes, bytes);
  EXPECT_CONTAINS(choice.function, function);
  EXPECT_EQ(choice.schedule, name_of(schedule));
  EXPECT_EQ(schedules::dispatch_workspace_bytes(s, shape), workspace);

  const auto spill = schedules::dispatch_spill_bytes(s, shape);
  ASSERT_EQ(spill.has_value(), spills);
  uint64_t spill_weights = 0, spill_grads = 0;
  if (spills) {
    const auto b = schedules::llep_spill_copy_bytes(E, W, H, F, kDtype, capacity, plans, lp);
    spill_weights = static_cast<uint64_t>(spill_layers) * b.weights;
    spill_grads = static_cast<uint64_t>(spill_layers) * b.grads + b.scratch;
    EXPECT_EQ(spill->weights, spill_weights);
    EXPECT_EQ(spill->grads, spill_grads);
    EXPECT_EQ(spill->schedule, name_of(schedule));
  }

  // Experts with biases (gpt-oss): the same `dispatch` bytes (biases add no dispatch buffer);
  // LLEP's copies, gradient copies and scratch each carry b1, b3 (F) and b2 (H) too.
  schedules::DispatchShape biased = shape;
  biased.expert_biases = true;
  EXPECT_EQ(schedules::dispatch_bytes(s, biased).bytes, choice.bytes);
  const auto biased_spill = schedules::dispatch_spill_bytes(s, biased);
  ASSERT_EQ(biased_spill.has_value(), spills);
  if (spills) {
    const auto b = schedules::llep_spill_copy_bytes(E, W, H, F, kDtype, capacity, plans, lp, true);
    const uint64_t one =
        DeviceArena::footprint(static_cast<uint64_t>(3 * F * H + 2 * F + H) * dtype_size(kDtype));
    EXPECT_EQ(schedules::llep_expert_elements(H, F, true), 3 * F * H + 2 * F + H);
    EXPECT_EQ(b.weights, static_cast<uint64_t>(b.copies) * one);
    EXPECT_EQ(biased_spill->weights, static_cast<uint64_t>(spill_layers) * b.weights);
    EXPECT_EQ(biased_spill->grads, static_cast<uint64_t>(spill_layers) * b.grads + b.scratch);
    EXPECT_CONTAINS(biased_spill->weights_function, ", biases");
    if (b.copies > 0) {
      EXPECT_GT(biased_spill->weights, spill->weights);
    }
  }

  // The planner prints the choice's term, and adds the spill to weights and grads.
  const Plan plan = make_plan(c, plan_inputs(c, W));
  expect_term(plan, LiveSet::dispatch, choice);
  Config standard = c;
  standard.schedules.dispatch = DispatchSchedule::standard;
  const Plan base = make_plan(standard, plan_inputs(standard, W));
  EXPECT_EQ(plan.term(LiveSet::weights).bytes, base.term(LiveSet::weights).bytes + spill_weights);
  EXPECT_EQ(plan.term(LiveSet::grads).bytes, base.term(LiveSet::grads).bytes + spill_grads);

  if (W != 1) return;  // objects: one rank only
  OneRank r;
  std::shared_ptr<schedules::PipelinedLlepLane> lane;
  const auto d = schedules::make_dispatch(s, *r.backend, r.stream, r.comm, kDtype, E, lane);
  ASSERT_TRUE(d);
  switch (kind) {
    case schedules::DispatchKind::standard:
      EXPECT_NE(dynamic_cast<schedules::StandardDispatch*>(d.get()), nullptr);
      break;
    case schedules::DispatchKind::expert_parallel:
      EXPECT_NE(dynamic_cast<schedules::ExpertParallelDispatch*>(d.get()), nullptr);
      break;
    case schedules::DispatchKind::llep:
      EXPECT_NE(dynamic_cast<schedules::LlepDispatch*>(d.get()), nullptr);
      break;
    case schedules::DispatchKind::pipelined_llep:
      EXPECT_NE(dynamic_cast<schedules::PipelinedLlepDispatch*>(d.get()), nullptr);
      break;
  }
  EXPECT_EQ(lane != nullptr, kind == schedules::DispatchKind::pipelined_llep);
  EXPECT_EQ(d->supports_plan_only(), kind == schedules::DispatchKind::pipelined_llep);
  // With gpt-oss's activation; a clamp limit of 0 is refused.
  EXPECT_TRUE(schedules::make_dispatch(s, *r.backend, r.stream, r.comm, kDtype, E, lane,
                                       ops::SwigluParams::gpt_oss()));
  EXPECT_THROW(schedules::make_dispatch(s, *r.backend, r.stream, r.comm, kDtype, E, lane,
                                        ops::SwigluParams::gpt_oss(0.0)),
               Error);
}

INSTANTIATE_TEST_SUITE_P(
    AllSchedules, DispatchChoice,
    testing::Combine(testing::Values(DispatchSchedule::standard, DispatchSchedule::llep,
                                     DispatchSchedule::pipelined_llep),
                     testing::Values(1, 4),
                     testing::Values(CheckpointSchedule::none, CheckpointSchedule::standard)),
    [](const testing::TestParamInfo<DispatchCase>& info) {
      return name_of(std::get<0>(info.param)) + "_W" + std::to_string(std::get<1>(info.param)) +
             "_" + name_of(std::get<2>(info.param));
    });

// ---- vocab (logits) ----------------------------------------------------------------------------

using VocabCase = std::tuple<VocabSchedule, int>;

class VocabChoice : public testing::TestWithParam<VocabCase> {};

TEST_P(VocabChoice, BytesObjectAndPlanAgree) {
  const auto [schedule, W] = GetParam();
  Config c = choice_config();
  c.schedules.vocab = schedule;
  c.schedules.vocab_strip = 16;
  c.schedules.vocab_kept_strips = 1;
  const SchedulesConfig& s = c.schedules;
  const int64_t N = tokens_of(c, W), H = c.model.hidden_size, V = c.model.vocab_size;

  uint64_t bytes = 0;
  LmHeadSharding head{};
  const char* function = nullptr;
  switch (schedule) {
    case VocabSchedule::materialized:
      bytes = schedules::vocab_materialized_bytes(N, V, kDtype);
      head = LmHeadSharding::zero3;
      function = "vocab_materialized_bytes(";
      break;
    case VocabSchedule::ring_dtp:
      bytes = schedules::ring_dtp_bytes(N, H, V, W, s.vocab_strip, s.vocab_kept_strips,
                                        s.ring_payload, kDtype);
      head = LmHeadSharding::vocab_rows;
      function = "ring_dtp_bytes(";
      break;
  }
  const schedules::ScheduleBytes choice = schedules::vocab_bytes(s, {N, H, V, W, kDtype});
  EXPECT_EQ(choice.bytes, bytes);
  EXPECT_CONTAINS(choice.function, function);
  EXPECT_EQ(choice.schedule, name_of(schedule));
  EXPECT_EQ(schedules::lm_head_sharding(schedule), head);
  EXPECT_EQ(lm_head_sharding(schedule), head);  // the model's name for it

  const Plan plan = make_plan(c, plan_inputs(c, W));
  expect_term(plan, LiveSet::logits, choice);
  EXPECT_EQ(plan.term(LiveSet::weights).bytes,
            zero_persistent_bytes(c.model, kDtype, W, head).weights +
                zero_pass_gathered_bytes(c.model, kDtype, ParallelDegrees::uniform(W), head,
                                         static_cast<int>(c.parallelism.zero_prefetch_depth))
                    .weights);

  if (W != 1) return;
  OneRank r;
  const auto v = schedules::make_vocab(s, *r.backend, r.stream, r.comm, kDtype, V);
  ASSERT_TRUE(v);
  if (schedule == VocabSchedule::materialized) {
    EXPECT_NE(dynamic_cast<schedules::MaterializedVocab*>(v.get()), nullptr);
  } else {
    EXPECT_NE(dynamic_cast<schedules::RingDtpVocab*>(v.get()), nullptr);
  }
}

TEST(VocabChoiceCheck, RingDtpNeedsAVocabularyRowPerRank) {
  SchedulesConfig s;
  s.vocab = VocabSchedule::ring_dtp;
  EXPECT_NO_THROW(schedules::check_vocab_schedule(s, 4, 4));
  EXPECT_THROW(schedules::check_vocab_schedule(s, 3, 4), Error);
  s.vocab = VocabSchedule::materialized;
  EXPECT_NO_THROW(schedules::check_vocab_schedule(s, 3, 4));
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, VocabChoice,
                         testing::Combine(testing::Values(VocabSchedule::materialized,
                                                          VocabSchedule::ring_dtp),
                                          testing::Values(1, 4)),
                         [](const testing::TestParamInfo<VocabCase>& info) {
                           return name_of(std::get<0>(info.param)) + "_W" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- checkpoint boundaries ---------------------------------------------------------------------

using CheckpointCase = std::tuple<CheckpointSchedule, int>;

class CheckpointChoice : public testing::TestWithParam<CheckpointCase> {};

TEST_P(CheckpointChoice, BytesObjectAndPlanAgree) {
  const auto [schedule, W] = GetParam();
  Config c = choice_config();
  c.schedules.checkpoint = schedule;
  const SchedulesConfig& s = c.schedules;
  const int64_t N = tokens_of(c, W), H = c.model.hidden_size, L = c.model.num_hidden_layers;
  const PlanInputs in = plan_inputs(c, W);
  // What an offloaded optimizer would hold: the pool less 1 MiB, under one 2 MiB block, so SCO's
  // "auto" budget here offloads no layer (and the plan's below, the whole pool, every layer).
  const uint64_t live = in.host_budget - (uint64_t{1} << 20);

  // SCO's "auto" budget: the pool's budget less what is live in it.
  const int64_t S = schedules::sco_offloaded_layers(L, N, H, kDtype, in.host_budget - live);
  uint64_t bytes = 0, host = 0;
  bool recompute = true;
  switch (schedule) {
    case CheckpointSchedule::none:
      recompute = false;
      [[fallthrough]];
    case CheckpointSchedule::standard:
      bytes = schedules::boundaries_standard_bytes(L, N, H, kDtype);
      break;
    case CheckpointSchedule::sco:
      bytes = schedules::sco_boundaries_bytes(L, S, N, H, kDtype);
      host = schedules::sco_host_bytes(S, N, H, kDtype);
      break;
  }
  const schedules::BoundariesBytes choice =
      schedules::boundaries_bytes(s, {L, N, H, kDtype, in.host_budget, live});
  EXPECT_EQ(choice.device.bytes, bytes);
  EXPECT_EQ(choice.device.schedule, name_of(schedule));
  EXPECT_EQ(schedules::recomputes_layers(schedule), recompute);
  EXPECT_EQ(schedules::resident_layers(schedule, L), recompute ? 1 : L);
  if (schedule == CheckpointSchedule::sco) {
    EXPECT_EQ(choice.offloaded_layers, S);
    ASSERT_EQ(choice.host.size(), 1u);
    EXPECT_EQ(choice.host[0].name, "sco_boundaries");
    EXPECT_EQ(choice.host[0].bytes, host);
    EXPECT_CONTAINS(choice.device.function, "sco_boundaries_bytes(");
  } else {
    EXPECT_EQ(choice.offloaded_layers, 0);
    EXPECT_TRUE(choice.host.empty());
    EXPECT_CONTAINS(choice.device.function, "boundaries_standard_bytes(");
  }

  // The planner: the resident optimizer holds nothing pinned, so SCO's budget is the whole pool.
  const Plan plan = make_plan(c, in);
  const schedules::BoundariesBytes planned =
      schedules::boundaries_bytes(s, {L, N, H, kDtype, in.host_budget, 0});
  expect_term(plan, LiveSet::boundaries, planned.device);
  EXPECT_EQ(plan.sco_offloaded_layers, planned.offloaded_layers);
  ASSERT_EQ(plan.host.size(), planned.host.size());
  for (size_t i = 0; i < plan.host.size(); ++i) {
    EXPECT_EQ(plan.host[i].name, planned.host[i].name);
    EXPECT_EQ(plan.host[i].bytes, planned.host[i].bytes);
    EXPECT_EQ(plan.host[i].function, planned.host[i].function);
  }

  if (W != 1) return;
  OneRank r;
  const auto b = schedules::make_boundaries(s, *r.backend, r.stream);
  ASSERT_TRUE(b);
  if (schedule == CheckpointSchedule::sco) {
    EXPECT_NE(dynamic_cast<schedules::ScoBoundaries*>(b.get()), nullptr);
  } else {
    EXPECT_NE(dynamic_cast<schedules::StandardBoundaries*>(b.get()), nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, CheckpointChoice,
                         testing::Combine(testing::Values(CheckpointSchedule::none,
                                                          CheckpointSchedule::standard,
                                                          CheckpointSchedule::sco),
                                          testing::Values(1, 4)),
                         [](const testing::TestParamInfo<CheckpointCase>& info) {
                           return name_of(std::get<0>(info.param)) + "_W" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- optimizer ---------------------------------------------------------------------------------

using OptimizerCase = std::tuple<OptimizerPlacement, int>;

class OptimizerChoice : public testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerChoice, BytesObjectAndPlanAgree) {
  const auto [placement, W] = GetParam();
  Config c = choice_config();
  c.optimizer.placement = placement;
  const OptimizerConfig& o = c.optimizer;
  const int64_t P = zero_persistent_elements(c.model, W, LmHeadSharding::zero3);

  uint64_t device = 0, state = 0, grad_copy = 0;
  switch (placement) {
    case OptimizerPlacement::resident:
      device = schedules::adamw_resident_bytes(P, kDtype);
      break;
    case OptimizerPlacement::offload_serial:
      state = schedules::adamw_offload_host_bytes(P, DType::f32);
      grad_copy = schedules::adamw_offload_serial_grad_bytes(P, DType::f32);
      break;
    case OptimizerPlacement::offload_stream: {
      const auto shape = schedules::offload_stream_shape(P, o.bucket_params, o.staging_slots);
      device = schedules::adamw_offload_stream_bytes(shape.bucket, shape.slots, DType::f32);
      state = schedules::adamw_offload_host_bytes(P, DType::f32);
      break;
    }
  }
  const schedules::OptimizerBytes choice = schedules::optimizer_bytes(o, P, kDtype);
  EXPECT_EQ(choice.device.bytes, device);
  EXPECT_EQ(choice.device.schedule, name_of(placement));
  EXPECT_EQ(choice.host_total(), state + grad_copy);
  ASSERT_EQ(choice.host.size(), static_cast<size_t>((state ? 1 : 0) + (grad_copy ? 1 : 0)));
  if (state) {
    EXPECT_EQ(choice.host[0].name, "optimizer_state");
    EXPECT_EQ(choice.host[0].bytes, state);
  }
  if (grad_copy) {
    EXPECT_EQ(choice.host[1].name, "optimizer_grad_copy");
    EXPECT_EQ(choice.host[1].bytes, grad_copy);
  }

  const Plan plan = make_plan(c, plan_inputs(c, W));
  expect_term(plan, LiveSet::optimizer, choice.device);
  ASSERT_EQ(plan.host.size(), choice.host.size());  // checkpoint = "standard": no SCO term
  for (size_t i = 0; i < plan.host.size(); ++i) {
    EXPECT_EQ(plan.host[i].name, choice.host[i].name);
    EXPECT_EQ(plan.host[i].bytes, choice.host[i].bytes);
    EXPECT_EQ(plan.host[i].function, choice.host[i].function);
  }

  if (W != 1) return;
  OneRank r;
  ParamStore params(*r.backend, c.model, kDtype);
  params.initialize(3, 0.02, r.stream);
  const auto opt = schedules::make_optimizer(*r.backend, optimizer_params(params), o, 1);
  ASSERT_TRUE(opt);
  EXPECT_EQ(opt->placement(), placement);
  switch (placement) {
    case OptimizerPlacement::resident:
      EXPECT_NE(dynamic_cast<schedules::ResidentAdamW*>(opt.get()), nullptr);
      break;
    case OptimizerPlacement::offload_serial:
      EXPECT_NE(dynamic_cast<schedules::SerialOffloadAdamW*>(opt.get()), nullptr);
      break;
    case OptimizerPlacement::offload_stream:
      EXPECT_NE(dynamic_cast<schedules::OffloadStreamAdamW*>(opt.get()), nullptr);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPlacements, OptimizerChoice,
                         testing::Combine(testing::Values(OptimizerPlacement::resident,
                                                          OptimizerPlacement::offload_serial,
                                                          OptimizerPlacement::offload_stream),
                                          testing::Values(1, 4)),
                         [](const testing::TestParamInfo<OptimizerCase>& info) {
                           return name_of(std::get<0>(info.param)) + "_W" +
                                  std::to_string(std::get<1>(info.param));
                         });

// With bf16 working weights the serial offload's host AdamW writes a pinned bf16 copy of the
// weights for the device to read: a third host term, the same in optimizer_bytes and the plan.
TEST(OptimizerChoiceBf16, SerialOffloadAddsTheBf16WeightCopy) {
  Config c = choice_config();
  c.training.dtype = ComputeDtype::bfloat16;
  c.optimizer.placement = OptimizerPlacement::offload_serial;
  const int64_t P = zero_persistent_elements(c.model, 1, LmHeadSharding::zero3);
  const schedules::OptimizerBytes choice = schedules::optimizer_bytes(c.optimizer, P, DType::bf16);
  EXPECT_EQ(choice.device.bytes, 0u);
  ASSERT_EQ(choice.host.size(), 3u);
  EXPECT_EQ(choice.host[0].bytes, schedules::adamw_offload_host_bytes(P, DType::f32));
  EXPECT_EQ(choice.host[1].bytes, schedules::adamw_offload_serial_grad_bytes(P, DType::f32));
  EXPECT_EQ(choice.host[2].name, "optimizer_weight_copy");
  EXPECT_EQ(choice.host[2].bytes, schedules::adamw_offload_serial_weight_bytes(P, DType::bf16));
  EXPECT_EQ(choice.host[2].bytes, PinnedPool::footprint(static_cast<uint64_t>(P) * 2));
  const Plan plan = make_plan(c, plan_inputs(c, 1));
  ASSERT_EQ(plan.host.size(), 3u);
  EXPECT_EQ(plan.host[2].name, "optimizer_weight_copy");
  EXPECT_EQ(plan.host[2].bytes, choice.host[2].bytes);
  EXPECT_EQ(plan.host[2].function, choice.host[2].function);
  EXPECT_CONTAINS(plan.host[2].function, "adamw_offload_serial_weight_bytes");
  // f32 weights are copied up from the master itself: no third term.
  EXPECT_EQ(schedules::optimizer_bytes(c.optimizer, P, DType::f32).host.size(), 2u);
}

}  // namespace
}  // namespace moepeak
