// The memory plan in layouts with independent degrees (Ep, Sp, data_shard; docs/parallelism.md)
// against real training steps on W ranks (4 and 8 under mpirun; plan_check.h): every rank's
// measured peak of every live set at or under the plan's term for those degrees, within 10%
// except the documented worst-case bounds, with the standard schedules and with all four bounded
// ones — the layouts of tests/parallel/test_train_layouts — and with DeepSeek-V3's parts.
// Run: ctest -R test_plan_layouts --output-on-failure
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "tests/plan/plan_check.h"

namespace moepeak {
namespace {

using test_support::deepseek_v3_parts;
using test_support::expect_within_plan;
using test_support::tiny_plan_config;

struct Degrees {
  int ep, sp, ds;
};

std::vector<Degrees> layouts_of(int world) {
  if (world == 4) return {{2, 2, 4}, {4, 1, 2}, {1, 4, 4}, {2, 4, 2}};
  if (world == 8) return {{2, 4, 4}, {4, 2, 8}};
  return {};
}

Config in_layout(Config c, const Degrees& d) {
  c.parallelism.expert_parallel = d.ep;
  c.parallelism.sequence_parallel = d.sp;
  c.parallelism.data_shard = d.ds;
  c.training.batch_size = 4;  // splits over up to 4 sequence groups
  c.model.num_local_experts = 8;
  return c;
}

std::string name_of(const Degrees& d, const char* schedules) {
  return "ep" + std::to_string(d.ep) + "_sp" + std::to_string(d.sp) + "_ds" + std::to_string(d.ds) +
         "_" + schedules;
}

TEST(PlanMeasuredLayouts, StandardSchedules) {
  const int W = init_process_group().world_size;
  if (layouts_of(W).empty()) GTEST_SKIP() << "layouts of 4 and 8 ranks";
  for (const Degrees& d : layouts_of(W)) {
    expect_within_plan(name_of(d, "standard"), in_layout(tiny_plan_config(), d));
  }
}

TEST(PlanMeasuredLayouts, AllBoundedSchedules) {
  const int W = init_process_group().world_size;
  if (layouts_of(W).empty()) GTEST_SKIP() << "layouts of 4 and 8 ranks";
  for (const Degrees& d : layouts_of(W)) {
    Config c = in_layout(tiny_plan_config(), d);
    c.schedules.dispatch = DispatchSchedule::pipelined_llep;
    c.schedules.chunk_tokens = 8;
    c.schedules.llep_lambda = 100.0;  // no spill: weights and grads exact
    c.schedules.vocab = VocabSchedule::ring_dtp;
    c.schedules.checkpoint = CheckpointSchedule::sco;
    c.optimizer.placement = OptimizerPlacement::offload_stream;
    expect_within_plan(name_of(d, "bounded"), c);
  }
}

// DeepSeek-V3's latent attention under Ulysses (q/k heads of 12 and value heads of 6 in their
// own exchanges, the staging the larger of the two), its dense first layer and shared experts:
// the standard schedules, every layer's activations kept (checkpoint = "none") with a plain q
// projection, and the four bounded schedules with the sequence-wise balance loss.
TEST(PlanMeasuredLayouts, DeepseekV3) {
  const int W = init_process_group().world_size;
  if (layouts_of(W).empty()) GTEST_SKIP() << "layouts of 4 and 8 ranks";
  for (const Degrees& d : layouts_of(W)) {
    Config c = in_layout(tiny_plan_config(), d);
    deepseek_v3_parts(c);
    expect_within_plan(name_of(d, "deepseek_v3"), c);
    c.schedules.checkpoint = CheckpointSchedule::none;
    c.model.q_lora_rank = 0;
    expect_within_plan(name_of(d, "deepseek_v3_none_plain_q"), c);
    c = in_layout(tiny_plan_config(), d);
    deepseek_v3_parts(c);
    c.schedules.dispatch = DispatchSchedule::pipelined_llep;
    c.schedules.chunk_tokens = 8;
    c.schedules.llep_lambda = 100.0;  // no spill: weights and grads exact
    c.schedules.vocab = VocabSchedule::ring_dtp;
    c.schedules.checkpoint = CheckpointSchedule::sco;
    c.optimizer.placement = OptimizerPlacement::offload_stream;
    c.model.router_aux_loss_coef = 0.1;  // the sequence-wise loss's exchange and gradient
    expect_within_plan(name_of(d, "deepseek_v3_bounded"), c);
  }
}

}  // namespace
}  // namespace moepeak
