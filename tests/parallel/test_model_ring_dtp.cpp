// The whole model with schedules.vocab = "ring_dtp" against "materialized", on the same W ranks
// (real processes), in float64, over three AdamW steps of the same global batches and seed.
// The two models differ only in the vocabulary projection: Ring-DTP keeps the LM head stored by
// vocabulary rows (LmHeadSharding::vocab_rows, never gathered) and folds logit strips into an
// online log-sum-exp; the materialised one gathers the LM head with the final norm. Checks
//   - each step's loss and grad norm within 1e-12 relative, and every parameter's gradient after
//     step 1 (gathered whole) within 1e-11 of the tensor's largest element: Ring-DTP sums the
//     same terms in another order (exponentials folded shard by shard, dX over shards, dW over
//     batches), a few ulps times the number of terms in f64;
//   - the LM head's values after the steps (gathered from its vocabulary rows) equal the
//     materialised model's within 1e-11: AdamW updates the rows where they live;
//   - forward_loss (evaluation, no backward) equals the materialised one;
//   - the `logits` peak of each step equals ring_dtp_bytes() of this rank's N = B*T/W tokens
//     (the planner's function) — at these toy sizes (4 tokens a rank) the ring's state and
//     payload buffers outweigh the materialised (N, V) logits; the saving at scale is measured by
//     `moepeak bench vocab` —; `weights` and `grads` peaks equal zero_persistent_bytes +
//     zero_pass_gathered_bytes with vocab_rows;
//   - V < W is rejected with the numbers.
// Cases: both payloads, strips of the whole shard and of 5 columns (with and without 3 strips
// kept from forward to backward); V = 37 is uneven over 2 and 4 ranks; about one label in seven
// is -100.
// Run: ctest -R model_ring_dtp --output-on-failure   (2 and 4 ranks under mpirun)
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/decoder.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "ops/schedules/vocab_ring_dtp.h"
#include "tests/expect_contains.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {

using test_support::global_batch;
using test_support::rel;
using test_support::scaled_error;
using test_support::TrainingRun;

constexpr DType kDtype = DType::f64;
constexpr int64_t kBatch = 2, kSeqLen = 8;

ModelConfig model_config() { return test_support::small_moe_model(); }

struct Case {
  const char* name;
  VocabPayload payload;
  int64_t strip;
  int64_t kept = 0;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ModelRingDtp : public ::testing::TestWithParam<Case> {};

TEST_P(ModelRingDtp, MatchesMaterializedLogitsOverThreeSteps) {
  const Case c = GetParam();
  const RankInfo ranks = init_process_group();
  const int W = ranks.world_size;
  const ModelConfig cfg = model_config();
  SchedulesConfig ring_schedules;
  ring_schedules.vocab = VocabSchedule::ring_dtp;
  ring_schedules.ring_payload = c.payload;
  ring_schedules.vocab_strip = c.strip;
  ring_schedules.vocab_kept_strips = c.kept;
  TrainingRun ref(ranks, cfg, SchedulesConfig{}, kDtype, 5);
  TrainingRun ring(ranks, cfg, ring_schedules, kDtype, 5);
  const ParamLayout& layout = ref.model->params().layout();
  const int64_t N = kBatch * kSeqLen / W, V = cfg.vocab_size, H = cfg.hidden_size;
  ASSERT_TRUE(ring.model->params().is_row_sharded(layout.find("lm_head.weight")) || W == 1);

  std::vector<int64_t> gids, glabels;
  for (int step = 1; step <= 3; ++step) {
    global_batch(step, kBatch * kSeqLen, V, gids, glabels, /*salt=*/3);
    ref.load(gids, glabels, kBatch, kSeqLen);
    ring.load(gids, glabels, kBatch, kSeqLen);
    ref.backend->arena().reset_peaks();
    ring.backend->arena().reset_peaks();
    const double want = ref.forward_backward();
    const double got = ring.forward_backward();
    EXPECT_LT(rel(got, want), 1e-12)
        << "step " << step << ": " << got << " vs materialised " << want;

    const MemoryStats mem = ring.backend->arena().stats();
    const uint64_t bound =
        schedules::ring_dtp_bytes(N, H, V, W, c.strip, c.kept, c.payload, kDtype);
    EXPECT_EQ(mem.peak_per_set()[LiveSet::logits], bound) << "step " << step;
    const ZeroBytes persistent = zero_persistent_bytes(cfg, kDtype, W, LmHeadSharding::vocab_rows);
    const ZeroBytes largest =
        zero_pass_gathered_bytes(cfg, kDtype, ParallelDegrees::uniform(W),
                                 LmHeadSharding::vocab_rows, kDefaultZeroPrefetchDepth);
    EXPECT_EQ(mem.peak_per_set()[LiveSet::weights], persistent.weights + largest.weights);
    EXPECT_EQ(mem.peak_per_set()[LiveSet::grads], persistent.grads + largest.grads);

    const double want_norm = ref.grad_norm(), got_norm = ring.grad_norm();
    EXPECT_LT(rel(got_norm, want_norm), 1e-12) << "step " << step << " grad norm";
    if (step == 1) {
      for (size_t p = 0; p < layout.params().size(); ++p) {
        const int i = static_cast<int>(p);
        const std::vector<double> g = ring.gathered(i, ring.model->params().flat_grads());
        const std::vector<double> w = ref.gathered(i, ref.model->params().flat_grads());
        EXPECT_LT(scaled_error(g, w), 1e-11) << layout.params()[p].name << " gradient";
      }
    }
    ref.update(step, want_norm, 1e-2);
    ring.update(step, got_norm, 1e-2);
  }
  const int head = layout.find("lm_head.weight");
  EXPECT_LT(scaled_error(ring.gathered(head, ring.model->params().flat_values()),
                         ref.gathered(head, ref.model->params().flat_values())),
            1e-11)
      << "LM head after three AdamW steps";
  EXPECT_LT(rel(ring.model->forward_loss(ring.batch, ring.loss_tokens),
                ref.model->forward_loss(ref.batch, ref.loss_tokens)),
            1e-12)
      << "evaluation loss";
}

INSTANTIATE_TEST_SUITE_P(
    Payloads, ModelRingDtp,
    ::testing::Values(Case{"weights_whole_shard", VocabPayload::weights, 0},
                      Case{"activations_whole_shard", VocabPayload::activations, 0},
                      Case{"auto_strips_of_5", VocabPayload::automatic, 5},
                      Case{"weights_strips_of_5_kept_3", VocabPayload::weights, 5, 3}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ModelRingDtpLayout, VocabularySmallerThanTheRanksIsRejected) {
  const RankInfo ranks = init_process_group();
  if (ranks.world_size < 2) GTEST_SKIP() << "needs two ranks";
  ModelConfig cfg = model_config();
  cfg.vocab_size = ranks.world_size - 1;
  SchedulesConfig s;
  s.vocab = VocabSchedule::ring_dtp;
  auto backend = Backend::create(BackendOptions{});
  auto comm = make_comm(*backend, ranks);
  try {
    DecoderModel model(*backend, backend->default_stream(), *comm, cfg, s, kDtype);
    ADD_FAILURE() << "V = " << cfg.vocab_size << " on " << ranks.world_size
                  << " ranks was accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), std::to_string(ranks.world_size));
  }
}

}  // namespace
}  // namespace moepeak
