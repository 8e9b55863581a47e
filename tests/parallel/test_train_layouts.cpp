// Training in layouts with independent degrees (Ep expert_parallel, Sp sequence_parallel, Ds
// data_shard; docs/parallelism.md) on W real rank processes against one rank on the same global
// batches and seed, in float32 — every rank also trains the one-rank model locally as the
// reference. For each layout of W, with the standard schedules and with all four bounded ones
// (PipelinedLLEP in several chunks with rebalancing, Ring-DTP in strips, SCO, OffloadStreamAdamW),
// for Mixtral and, on 4 ranks, for Qwen3-MoE's parts (and a tied head) and gpt-oss's (sinks, a
// sliding window shorter than the sequence, biases, its router and clamped experts; Sp = 4 puts
// one query head on each rank and replicates the kv heads), and DeepSeek-V3's (latent attention
// with value heads narrower than the q/k heads, a dense first layer, group-limited sigmoid
// routing, a shared expert, the sequence-wise balance loss, and correction biases that the
// balancing moves every step — after the 10 steps the biases on every rank equal one rank's bit
// for bit):
//   - the loss and the grad norm of each of 10 AdamW steps within 1e-5 relative;
//   - every parameter's gradient after step 1 (gathered from the shards) within 1e-5 relative to
//     the tensor's largest element;
//   - under the standard schedules, the per-rank `weights` and `grads` peaks: exactly the
//     persistent shards plus the largest gathered group, from the planner's functions for these
//     degrees; and the persistent weights fall with the expert replicas (W/Ep).
// The tolerance: the ranks sum the same products in another order (per-rank partial sums, then
// the collectives), so agreement is to fp32 rounding, not bitwise.
// Also: a checkpoint written in one layout resumes in another (the Trainer end to end), and
// degrees that do not fit are rejected with their numbers before any work.
// Run: ctest -R train_layouts --output-on-failure   (4 and 8 ranks under mpirun)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/train/trainer.h"
#include "tests/expect_contains.h"
#include "tests/parallel/shared_run_dir.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::global_batch;
using test_support::rel;
using test_support::TrainingRun;

using test_support::LayoutModel;
using test_support::model_of;

struct LayoutCase {
  int world, ep, sp, ds;
  bool bounded;
  LayoutModel model = LayoutModel::mixtral;
  ParallelDegrees degrees() const { return {world, ep, sp, ds}; }
};

std::string name_of(const LayoutCase& c) {
  const char* model[] = {"", "_qwen3", "_qwen3_tied", "_gpt_oss", "_deepseek_v3"};
  return "W" + std::to_string(c.world) + "_ep" + std::to_string(c.ep) + "_sp" +
         std::to_string(c.sp) + "_ds" + std::to_string(c.ds) +
         (c.bounded ? "_bounded" : "_standard") + model[static_cast<int>(c.model)];
}

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << name_of(c); }

SchedulesConfig schedules_of(bool bounded) {
  return bounded ? test_support::bounded_schedules() : SchedulesConfig{};
}

class TrainLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(TrainLayouts, MatchesOneRankOverTenSteps) {
  const LayoutCase c = GetParam();
  const RankInfo ranks = init_process_group();
  if (ranks.world_size != c.world) GTEST_SKIP() << "a layout of " << c.world << " ranks";
  const ModelConfig cfg = model_of(c.model);
  const int64_t B = 4, T = 8;
  const SchedulesConfig schedules = schedules_of(c.bounded);
  const OptimizerPlacement placement =
      c.bounded ? OptimizerPlacement::offload_stream : OptimizerPlacement::resident;
  TrainingRun ref(RankInfo{}, cfg, SchedulesConfig{});  // one rank, standard, in this process
  TrainingRun dist(ranks, cfg, schedules, DType::f32, 11, c.degrees(), placement);
  const ParamLayout& layout = ref.model->params().layout();
  const LmHeadSharding head = lm_head_sharding(schedules.vocab);

  std::vector<int64_t> gids, glabels;
  double worst_loss = 0, worst_norm = 0, worst_grad = 0;
  for (int step = 1; step <= 10; ++step) {
    global_batch(step, B * T, cfg.vocab_size, gids, glabels, 5);
    const double ref_loss = ref.forward_backward(gids, glabels, B, T);
    if (step == 1) dist.backend->arena().reset_peaks();
    const double loss = dist.forward_backward(gids, glabels, B, T);
    EXPECT_LT(rel(loss, ref_loss), 1e-5)
        << "step " << step << ": " << loss << " vs one rank " << ref_loss;
    const double ref_norm = ref.grad_norm(), norm = dist.grad_norm();
    EXPECT_LT(rel(norm, ref_norm), 1e-5) << "step " << step << " grad norm";
    worst_loss = std::max(worst_loss, rel(loss, ref_loss));
    worst_norm = std::max(worst_norm, rel(norm, ref_norm));

    if (step == 1) {
      const MemoryStats mem = dist.backend->arena().stats();
      const ZeroBytes persistent = zero_persistent_bytes(cfg, DType::f32, c.degrees(), head);
      const ZeroBytes gathered =
          zero_pass_gathered_bytes(cfg, DType::f32, c.degrees(), head, kDefaultZeroPrefetchDepth);
      if (!c.bounded) {  // (LLEP's spilled copies join weights and grads under the bounded ones)
        EXPECT_EQ(mem.peak_per_set()[LiveSet::weights], persistent.weights + gathered.weights);
        EXPECT_EQ(mem.peak_per_set()[LiveSet::grads], persistent.grads + gathered.grads);
      }
      // Each expert is ZeRO-3 sharded over its W/Ep replicas: a rank stores 1/(W/Ep) of each of
      // its E/Ep experts, so its expert elements fall with W, not just with Ep.
      const int64_t replicas = c.world / c.ep, experts_here = cfg.num_local_experts / c.ep;
      const int64_t F = cfg.expert_intermediate_size(), H = cfg.hidden_size;
      auto shard = [&](int64_t n) { return (n + replicas - 1) / replicas; };
      // gate, down and up, and with biases (gpt-oss) their (F), (H) and (F) biases.
      const int64_t per_expert =
          3 * shard(F * H) + (c.model == LayoutModel::gpt_oss ? 2 * shard(F) + shard(H) : 0);
      int64_t expert_elements = 0;
      for (const auto& piece : dist.model->params().local_pieces()) {
        if (piece.is_expert) expert_elements += piece.value.numel();
      }
      EXPECT_EQ(expert_elements, dist.model->spec().moe_layers() * experts_here * per_expert);
      for (size_t p = 0; p < layout.params().size(); ++p) {
        const int i = static_cast<int>(p);
        const std::vector<double> got = dist.gathered(i, dist.model->params().flat_grads());
        const std::vector<double> want = ref.gathered(i, ref.model->params().flat_grads());
        const double err = test_support::scaled_error(got, want);
        worst_grad = std::max(worst_grad, err);
        EXPECT_LT(err, 1e-5) << layout.params()[p].name << " gradient after step 1";
      }
    }
    const double lr = 1e-2 * std::min(1.0, step / 3.0);
    ref.update(step, ref_norm, lr);
    dist.update(step, norm, lr);
  }
  // The correction biases moved by the balancing: the same on every rank as on one rank, bit for
  // bit (the update is a sign of job-wide counts), and moved at all.
  for (const LayerParamIndex& L : layout.layers) {
    if (L.router_correction_bias < 0) continue;
    const std::vector<double> got =
        dist.gathered(L.router_correction_bias, dist.model->params().flat_values());
    const std::vector<double> want =
        ref.gathered(L.router_correction_bias, ref.model->params().flat_values());
    EXPECT_EQ(got, want) << layout.params()[L.router_correction_bias].name;
    EXPECT_NE(want, std::vector<double>(want.size(), 0.0));
  }
  if (ranks.rank == 0) {
    std::printf("  %s: 10 steps, worst relative loss %.2e, grad norm %.2e; step-1 gradients %.2e\n",
                name_of(c).c_str(), worst_loss, worst_norm, worst_grad);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Degrees, TrainLayouts,
    ::testing::Values(LayoutCase{4, 2, 2, 4, false}, LayoutCase{4, 2, 2, 4, true},
                      LayoutCase{4, 4, 1, 2, false}, LayoutCase{4, 4, 1, 2, true},
                      LayoutCase{4, 1, 4, 4, false}, LayoutCase{4, 1, 4, 4, true},
                      LayoutCase{4, 2, 4, 2, false}, LayoutCase{4, 2, 4, 2, true},
                      LayoutCase{8, 2, 4, 4, false}, LayoutCase{8, 2, 4, 4, true},
                      LayoutCase{8, 4, 2, 8, false}, LayoutCase{8, 4, 2, 8, true},
                      LayoutCase{4, 2, 2, 4, false, LayoutModel::qwen3},
                      LayoutCase{4, 2, 2, 4, true, LayoutModel::qwen3},
                      LayoutCase{4, 4, 1, 2, true, LayoutModel::qwen3},
                      LayoutCase{4, 1, 4, 4, true, LayoutModel::qwen3},
                      LayoutCase{4, 2, 4, 2, false, LayoutModel::qwen3_tied},
                      LayoutCase{4, 1, 4, 4, false, LayoutModel::gpt_oss},
                      LayoutCase{4, 1, 4, 4, true, LayoutModel::gpt_oss},
                      LayoutCase{4, 2, 2, 4, false, LayoutModel::gpt_oss},
                      LayoutCase{4, 2, 2, 4, true, LayoutModel::gpt_oss},
                      LayoutCase{4, 4, 1, 2, true, LayoutModel::gpt_oss},
                      LayoutCase{4, 1, 4, 4, false, LayoutModel::deepseek_v3},
                      LayoutCase{4, 1, 4, 4, true, LayoutModel::deepseek_v3},
                      LayoutCase{4, 2, 2, 4, true, LayoutModel::deepseek_v3},
                      LayoutCase{4, 4, 1, 2, false, LayoutModel::deepseek_v3},
                      LayoutCase{4, 2, 4, 2, true, LayoutModel::deepseek_v3}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return name_of(info.param); });

// The Trainer in a layout set by the [parallelism] keys: 4 steps of the tiny model (4 experts,
// 4 heads over 2 kv heads) on the gradient-accumulation job.
Config layout_config(const fs::path& dir, const std::string& name, int ep, int sp, int ds) {
  Config cfg = test_support::accum_config(dir, (dir / "tokens.bin").string(), 4, 1, 4);
  cfg.job.name = name;
  cfg.parallelism.expert_parallel = ep;
  cfg.parallelism.sequence_parallel = sp;
  cfg.parallelism.data_shard = ds;
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 2;
  cfg.checkpoint.keep_latest = 2;
  return cfg;
}

TEST(TrainLayoutsCheckpoint, ACheckpointOfOneLayoutResumesInAnother) {
  const RankInfo ranks = init_process_group();
  if (ranks.world_size != 4) GTEST_SKIP() << "written for 4 ranks";
  test_support::SharedRunDir dir;
  const TrainResult full = train(layout_config(dir.path(), "ep2_sp2_ds4", 2, 2, 4), {});
  ASSERT_EQ(full.losses.size(), 4u);
  const std::string step2 =
      (fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(2)).string();
  // Resumed with other degrees: every expert on each rank's own group of 4, the dense weights
  // sharded over pairs and replicated, whole sequences per rank; then the default layout.
  for (const auto& [name, ep, sp, ds] :
       {std::tuple{"ep4_sp1_ds2", 4, 1, 2}, std::tuple{"uniform", 0, 0, 0}}) {
    TrainOptions options;
    options.resume_from = step2;
    const TrainResult resumed = train(layout_config(dir.path(), name, ep, sp, ds), options);
    ASSERT_EQ(resumed.losses.size(), 2u) << name;
    EXPECT_LT(rel(resumed.losses[0], full.losses[2]), 1e-5) << name << " step 3";
    EXPECT_LT(rel(resumed.losses[1], full.losses[3]), 1e-5) << name << " step 4";
  }
}

TEST(TrainLayoutsCheck, DegreesThatDoNotFitAreRejectedWithTheirNumbers) {
  const ModelConfig m = test_support::layout_model();
  auto message = [](const auto& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  ParallelismConfig p;
  p.expert_parallel = 3;
  EXPECT_CONTAINS(message([&] { ParallelDegrees::resolve(p, 4); }),
                  "parallelism.expert_parallel = 3 must divide the world size W = 4");
  p = {};
  p.data_shard = 8;
  EXPECT_CONTAINS(message([&] { ParallelDegrees::resolve(p, 4); }),
                  "parallelism.data_shard = 8 must divide the world size W = 4");
  ModelConfig six = m;
  six.num_local_experts = 6;
  EXPECT_CONTAINS(message([&] {
                    DecoderModel::check_layout(six, 4, 8, {8, 4, 8, 8});
                  }),
                  "num_local_experts (6) divisible by Ep");
  // Sp = 2 of 8 ranks: 4 sequence groups, and a batch of 6 does not split over them.
  EXPECT_CONTAINS(message([&] {
                    DecoderModel::check_layout(m, 6, 8, {8, 8, 2, 8});
                  }),
                  "training.batch_size (6) divisible by W/Sp = 4");
  // Sp = 4: T = 10 is not a multiple of 4.
  EXPECT_NE(message([&] { DecoderModel::check_layout(m, 4, 10, {8, 8, 4, 8}); }), "no error");
  EXPECT_EQ(message([&] { DecoderModel::check_layout(m, 4, 8, {8, 2, 4, 4}); }), "no error");
}

}  // namespace
}  // namespace moepeak
