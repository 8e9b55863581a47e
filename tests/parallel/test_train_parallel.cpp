// Training on W real rank processes (ZeRO-3 dense weights, sequence-parallel attention, expert
// parallel dispatch) against one rank on the same global batches and seed, in float32: every
// rank also trains the one-rank model locally as the reference. Checks
//   - the loss of each of 10 AdamW steps (clipping and LR schedule included) and the grad norm,
//     within 1e-5 relative;
//   - every parameter's gradient after step 1 (gathered from the shards and the experts'
//     owners) within 1e-5 relative to the tensor's largest element;
//   - the per-rank `weights` and `grads` peaks: the persistent shards plus exactly one gathered
//     group (the largest), never the model;
//   - a layout that cannot be split over W is rejected with its numbers.
//   - under SCO, each rank's `boundaries` peak equals sco_boundaries_bytes of its N = B*T/W
//     tokens (the planner's function), and every boundary went through host memory.
// Configurations: kv heads split over ranks, kv heads replicated (fewer kv heads than ranks), no
// checkpointing with the load-balancing loss, odd sizes that need shard padding, SCO.
// Run: ctest -R train_parallel --output-on-failure   (2 and 4 ranks under mpirun)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"

#include "ops/schedules/checkpoint_sco.h"
#include "tests/expect_contains.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {

using test_support::global_batch;
using test_support::rel;
using test_support::TrainingRun;

struct Case {
  const char* name;
  int64_t hidden, heads, kv_heads, head_dim, experts, top_k;
  CheckpointSchedule checkpoint;
  double aux_coef;
  int64_t batch, seq_len;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ModelConfig model_of(const Case& c) {
  ModelConfig m;
  m.vocab_size = 37;
  m.hidden_size = c.hidden;
  m.intermediate_size = 20;
  m.num_hidden_layers = 2;
  m.num_attention_heads = c.heads;
  m.num_key_value_heads = c.kv_heads;
  m.head_dim = c.head_dim;
  m.num_local_experts = c.experts;
  m.num_experts_per_tok = c.top_k;
  m.max_position_embeddings = 64;
  m.router_aux_loss_coef = c.aux_coef;
  m.initializer_range = 0.2;
  return m;
}

class TrainParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TrainParallel, MatchesOneRankOverTenSteps) {
  const Case c = GetParam();
  const RankInfo ranks = init_process_group();
  const ModelConfig cfg = model_of(c);
  const int64_t B = c.batch, T = c.seq_len;
  SchedulesConfig schedules;
  schedules.checkpoint = c.checkpoint;
  TrainingRun ref(RankInfo{}, cfg, schedules);  // one rank, in this process
  TrainingRun dist(ranks, cfg, schedules);      // this rank of W
  const ParamLayout& layout = ref.model->params().layout();

  std::vector<int64_t> gids, glabels;
  for (int step = 1; step <= 10; ++step) {
    global_batch(step, B * T, cfg.vocab_size, gids, glabels);
    const double ref_loss = ref.forward_backward(gids, glabels, B, T);
    if (step == 1) dist.backend->arena().reset_peaks();
    const double loss = dist.forward_backward(gids, glabels, B, T);
    EXPECT_LT(rel(loss, ref_loss), 1e-5)
        << "step " << step << ": " << loss << " vs one rank " << ref_loss;
    const double ref_norm = ref.grad_norm(), norm = dist.grad_norm();
    EXPECT_LT(rel(norm, ref_norm), 1e-5) << "step " << step << " grad norm";

    if (step == 1) {
      const MemoryStats mem = dist.backend->arena().stats();
      const ZeroBytes persistent = zero_persistent_bytes(cfg, DType::f32, ranks.world_size);
      const ZeroBytes gathered =
          zero_pass_gathered_bytes(cfg, DType::f32, ParallelDegrees::uniform(ranks.world_size),
                                   LmHeadSharding::zero3, kDefaultZeroPrefetchDepth);
      EXPECT_EQ(mem.peak_per_set()[LiveSet::weights], persistent.weights + gathered.weights);
      EXPECT_EQ(mem.peak_per_set()[LiveSet::grads], persistent.grads + gathered.grads);
      if (c.checkpoint == CheckpointSchedule::sco) {
        auto& sco = dynamic_cast<schedules::ScoBoundaries&>(dist.model->boundaries());
        const int64_t L = cfg.num_hidden_layers, N = B * T / ranks.world_size;
        EXPECT_EQ(sco.offloaded_layers(), L) << "the default pinned budget holds every boundary";
        EXPECT_EQ(mem.peak_per_set()[LiveSet::boundaries],
                  schedules::sco_boundaries_bytes(L, sco.offloaded_layers(), N, cfg.hidden_size,
                                                  DType::f32));
      }
      // One group at a time is far less than the whole model (the point of ZeRO-3).
      EXPECT_LT(persistent.weights + gathered.weights,
                DeviceArena::footprint(static_cast<uint64_t>(layout.total_elements()) * 4));

      for (size_t p = 0; p < layout.params().size(); ++p) {
        const int i = static_cast<int>(p);
        std::vector<char> bytes =
            dist.model->params().gather_full(i, dist.model->params().flat_grads(), dist.stream);
        const float* got = reinterpret_cast<const float*>(bytes.data());
        const float* want = ref.model->params().local_grad(i).data_as<float>();
        const int64_t n = layout.params()[p].shape.numel();
        double scale = 0, worst = 0;
        for (int64_t j = 0; j < n; ++j)
          scale = std::max(scale, std::abs(static_cast<double>(want[j])));
        for (int64_t j = 0; j < n; ++j) {
          worst = std::max(
              worst, std::abs(static_cast<double>(got[j]) - want[j]) / std::max(scale, 1e-30));
        }
        EXPECT_LT(worst, 1e-5) << layout.params()[p].name << " gradient after step 1";
        // (An expert no token was routed to has none, on one rank as on W.)
        if (!dist.model->params().is_expert(i)) {
          EXPECT_GT(scale, 0.0) << layout.params()[p].name << " has no gradient";
        }
      }
    }
    const double lr = 1e-2 * std::min(1.0, step / 3.0);
    ref.update(step, ref_norm, lr);
    dist.update(step, norm, lr);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TrainParallel,
    ::testing::Values(
        // kv heads split over 2 ranks, replicated on 4
        Case{"kv2_standard", 16, 4, 2, 4, 4, 2, CheckpointSchedule::standard, 0.0, 2, 8},
        // one kv head: replicated on every rank
        Case{"kv1_standard", 16, 4, 1, 4, 4, 2, CheckpointSchedule::standard, 0.0, 3, 8},
        // every activation kept, with the load-balancing loss
        Case{"kv4_none_aux", 16, 4, 4, 4, 8, 2, CheckpointSchedule::none, 0.05, 2, 12},
        // hidden 13: every dense shard is padded on 2 and 4 ranks
        Case{"odd_hidden", 13, 8, 4, 2, 4, 2, CheckpointSchedule::standard, 0.0, 1, 16},
        // every layer's input offloaded to pinned host memory and brought back one layer ahead
        Case{"kv2_sco_aux", 16, 4, 2, 4, 4, 2, CheckpointSchedule::sco, 0.02, 2, 8}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(TrainParallelLayout, RejectsWhatCannotBeSplitWithTheNumbers) {
  const RankInfo ranks = init_process_group();
  const int W = ranks.world_size;
  ModelConfig m = model_of(Case{"x", 16, 4, 2, 4, 4, 2, CheckpointSchedule::standard, 0.0, 2, 8});
  m.num_attention_heads = 3 * W + 1;  // not a multiple of W
  m.num_key_value_heads = 1;
  try {
    DecoderModel::check_layout(m, 2, 8, W);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), std::to_string(3 * W + 1) + " query heads");
    EXPECT_CONTAINS(e.what(), std::to_string(W));
  }
  m = model_of(Case{"x", 16, 4, 2, 4, 4, 2, CheckpointSchedule::standard, 0.0, 2, 8});
  m.num_local_experts = W + 1;
  try {
    DecoderModel::check_layout(m, 2, 8, W);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "num_local_experts (" + std::to_string(W + 1) + ")");
  }
  EXPECT_THROW(DecoderModel::check_layout(
                   model_of(Case{"x", 16, 4, 2, 4, 4, 2, CheckpointSchedule::standard, 0.0, 2, 8}),
                   2, 4 * W + 1, W),
               Error);  // T not a multiple of W
}

}  // namespace
}  // namespace moepeak
