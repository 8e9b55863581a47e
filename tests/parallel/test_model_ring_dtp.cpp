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
//     zero_largest_gathered_bytes with vocab_rows;
//   - V < W is rejected with the numbers.
// Cases: both payloads, strips of the whole shard and of 5 columns; V = 37 is uneven over 2 and
// 4 ranks; about one label in seven is -100.
// Run: ctest -R model_ring_dtp --output-on-failure   (2 and 4 ranks under mpirun)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/data/batch_shard.h"
#include "core/error.h"
#include "core/model/mixtral.h"
#include "core/model/zero_params.h"
#include "ops/elementwise.h"
#include "ops/fill.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/vocab_ring_dtp.h"
#include "tests/expect_contains.h"

namespace moepeak {
namespace {

constexpr DType kDtype = DType::f64;
constexpr int64_t kBatch = 2, kSeqLen = 8;

ModelConfig model_config() {
  ModelConfig m;
  m.vocab_size = 37;
  m.hidden_size = 16;
  m.intermediate_size = 20;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  m.router_aux_loss_coef = 0.02;
  m.initializer_range = 0.2;
  return m;
}

struct Case {
  const char* name;
  VocabPayload payload;
  int64_t strip;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The global batch of a step: (B*T) ids and labels, about one label in seven not scored.
void global_batch(int step, int64_t n, int64_t vocab, std::vector<int64_t>& ids,
                  std::vector<int64_t>& labels) {
  ids.resize(static_cast<size_t>(n));
  labels.resize(static_cast<size_t>(n));
  uint64_t x = 0x2545f4914f6cdd1dull * static_cast<uint64_t>(step + 3);
  auto next = [&] {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
    labels[i] = next() % 7 == 0 ? -100 : static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
  }
}

// A model with the given [schedules] on this rank's share of the W ranks, with its AdamW.
struct ModelRun {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm;
  std::unique_ptr<MixtralModel> model;
  std::unique_ptr<schedules::ResidentAdamW> adamw;
  OwnedTensor ids, labels, positions;
  TokenBatch batch;
  int64_t loss_tokens = 0;

  ModelRun(const RankInfo& ranks, const ModelConfig& cfg, const SchedulesConfig& schedules) {
    comm = make_comm(*backend, ranks);
    model = std::make_unique<MixtralModel>(*backend, stream, *comm, cfg, schedules, kDtype);
    model->params().initialize(5, cfg.initializer_range, stream);
    OptimizerConfig opt;
    opt.weight_decay = 0.1;
    adamw = std::make_unique<schedules::ResidentAdamW>(*backend, model->params(), opt);
  }

  void load(const std::vector<int64_t>& gids, const std::vector<int64_t>& glabels) {
    const LocalBatch local = shard_batch(gids, glabels, kBatch, kSeqLen, comm->world_size(), comm->rank());
    const int64_t N = static_cast<int64_t>(local.input_ids.size());
    auto upload = [&](OwnedTensor& t, const std::vector<int64_t>& v, const char* what) {
      t = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, what);
      std::memcpy(t.data(), v.data(), static_cast<size_t>(N) * 8);
    };
    upload(ids, local.input_ids, "ids");
    upload(labels, local.labels, "labels");
    upload(positions, local.positions, "positions");
    batch = TokenBatch{ids, labels, positions, kBatch, kSeqLen, count_scored(local.labels)};
    loss_tokens = count_scored(glabels);
  }

  double forward_backward() {
    model->params().zero_grads(stream);
    return model->forward_backward(batch, loss_tokens);
  }

  double grad_norm() {
    OwnedTensor acc = OwnedTensor::device(*backend, Shape{1}, DType::f64, LiveSet::workspace, "norm");
    ops::fill(acc, 0.0, stream);
    ops::sum_squares_cpu(model->params().flat_grads(), acc, stream);
    stream.synchronize();
    double sum[1] = {acc.data_as<double>()[0]};
    all_reduce_host(*comm, *backend, stream, sum);
    return std::sqrt(sum[0]);
  }

  void update(int step, double norm) {
    const double clip = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
    adamw->step(step, 1e-2, clip, stream);
    stream.synchronize();
  }

  std::vector<double> gathered(int param, const Tensor& flat) {
    std::vector<char> bytes = model->params().gather_full(param, flat, stream);
    std::vector<double> out(bytes.size() / sizeof(double));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// max |got - want| / max |want|
double scaled_error(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t j = 0; j < want.size(); ++j) worst = std::max(worst, std::abs(got[j] - want[j]));
  return worst / std::max(scale, 1e-300);
}

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
  ModelRun ref(ranks, cfg, SchedulesConfig{});
  ModelRun ring(ranks, cfg, ring_schedules);
  const ParamLayout& layout = ref.model->params().layout();
  const int64_t N = kBatch * kSeqLen / W, V = cfg.vocab_size, H = cfg.hidden_size;
  ASSERT_TRUE(ring.model->params().is_row_sharded(layout.find("lm_head.weight")) || W == 1);

  std::vector<int64_t> gids, glabels;
  for (int step = 1; step <= 3; ++step) {
    global_batch(step, kBatch * kSeqLen, V, gids, glabels);
    ref.load(gids, glabels);
    ring.load(gids, glabels);
    ref.backend->arena().reset_peaks();
    ring.backend->arena().reset_peaks();
    const double want = ref.forward_backward();
    const double got = ring.forward_backward();
    EXPECT_LT(rel(got, want), 1e-12) << "step " << step << ": " << got << " vs materialised " << want;

    const MemoryStats mem = ring.backend->arena().stats();
    const uint64_t bound = schedules::ring_dtp_bytes(N, H, V, W, c.strip, c.payload, kDtype);
    EXPECT_EQ(mem.peak_per_set()[LiveSet::logits], bound) << "step " << step;
    const ZeroBytes persistent = zero_persistent_bytes(cfg, kDtype, W, LmHeadSharding::vocab_rows);
    const ZeroBytes largest = zero_largest_gathered_bytes(cfg, kDtype, W, LmHeadSharding::vocab_rows);
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
    ref.update(step, want_norm);
    ring.update(step, got_norm);
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
                      Case{"auto_strips_of_5", VocabPayload::automatic, 5}),
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
    MixtralModel model(*backend, backend->default_stream(), *comm, cfg, s, kDtype);
    ADD_FAILURE() << "V = " << cfg.vocab_size << " on " << ranks.world_size << " ranks was accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), std::to_string(ranks.world_size));
  }
}

}  // namespace
}  // namespace moepeak
