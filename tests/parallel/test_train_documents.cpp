// Packed documents (training.document_mask and reset_position_ids; core/data/documents.h): one
// training step on a batch of windows that each hold several documents equals each document run
// alone — its own sequence on a one-rank model, positions from 0 (reset) or where it sits in the
// window (not), the EOS's label unscored — with their losses and gradients summed, in float32
// within 1e-5 (the loss relative, every gradient relative to its tensor's largest element):
//   - on one rank and on 4 ranks: Ulysses over Sp = 4 and Sp = 2, whole sequences per rank
//     (Sp = 1), the standard schedules and all four bounded ones (PipelinedLLEP, Ring-DTP, SCO,
//     OffloadStreamAdamW's placement does not enter a step's gradients);
//   - Mixtral's attention, gpt-oss's (sinks, a sliding window of 3: both compose with the
//     documents) and DeepSeek-V3's latent attention;
//   - the batch's rows hold the edge cases: an EOS at position 0, consecutive EOS (a one-token
//     document), an EOS at T - 1 (its label, the next window's first token, unscored), a row
//     with no EOS (a document longer than the window), one with an EOS at 1 and at T - 2.
// The batch reaches the model as the trainer reads it: read_local_batch over a loader, so every
// rank reads its sequence group's whole rows and cuts its own slice.
// The tolerance: the packed step sums the same products as the documents alone, but in other
// groupings (longer rows, other blockings, the ranks' collectives), so agreement is to fp32
// rounding. The auxiliary losses are off: the load-balancing loss averages over a batch's tokens
// and the sequence-wise one over a sequence's, so neither splits into per-document terms.
// A control: the packed batch without the mask differs from the documents alone (> 1e-3).
// And the Trainer end to end (a token file cut at its EOS, the evaluation with the same settings):
// with Sp = 4 (every rank a quarter of each sequence) its losses and evaluation equal those of
// whole sequences per rank (Sp = 1) within 1e-5, and differ from attending across documents.
// Run: ctest -R train_documents --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/data/batch_shard.h"
#include "core/data/documents.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/train/trainer.h"
#include "tests/grad_accum_job.h"
#include "tests/parallel/shared_run_dir.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {

using test_support::LayoutModel;
using test_support::rel;
using test_support::TrainingRun;

constexpr int64_t kEos = 3;
constexpr int64_t kBatch = 4, kSeq = 16;

// A (B, T) batch of windows as a token file gives them: labels[t] = ids[t + 1], the last one the
// token after the window.
struct Windows {
  std::vector<int64_t> ids, labels;
};

Windows packed_windows(int64_t V) {
  const int64_t B = kBatch, T = kSeq;
  uint64_t x = 0x243f6a8885a308d3ull;
  auto next = [&] { return test_support::splitmix64(x); };
  auto token = [&] {  // any token but the EOS
    int64_t id = static_cast<int64_t>(next() % static_cast<uint64_t>(V - 1));
    return id >= kEos ? id + 1 : id;
  };
  std::vector<int64_t> stream(static_cast<size_t>(B * (T + 1)));
  for (int64_t& id : stream) id = token();
  auto eos_at = [&](int64_t b, std::initializer_list<int64_t> ts) {
    for (int64_t t : ts) stream[static_cast<size_t>(b * (T + 1) + t)] = kEos;
  };
  eos_at(0, {0, 5, 6, T - 1});  // at 0, consecutive, at T - 1
  // row 1: no EOS — the window starts and ends inside one document
  eos_at(2, {1, 9, T - 2});
  eos_at(3, {3, 7, 8, 12, T});  // T: the token after the window (the last label) is an EOS
  Windows w;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      w.ids.push_back(stream[static_cast<size_t>(b * (T + 1) + t)]);
      w.labels.push_back(stream[static_cast<size_t>(b * (T + 1) + t + 1)]);
    }
  }
  return w;
}

// One batch of windows as a DataLoader (every batch the same), so that the test reads it as the
// trainer does.
class WindowsLoader final : public DataLoader {
 public:
  explicit WindowsLoader(const Windows& w) : w_(w) {}
  int64_t batch_size() const override { return kBatch; }
  int64_t seq_len() const override { return kSeq; }
  void read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) override {
    check_block(block, kBatch, kSeq);
    for (int64_t r = 0; r < block.rows; ++r) {
      for (int64_t c = 0; c < block.cols; ++c) {
        const size_t at = static_cast<size_t>((block.row_begin + r) * kSeq + block.col_begin + c);
        input_ids[r * block.cols + c] = w_.ids[at];
        labels[r * block.cols + c] = w_.labels[at];
      }
    }
  }
  void advance() override {}
  std::vector<uint8_t> state() const override { return {}; }
  void restore(std::span<const uint8_t>) override {}
  std::string describe() const override { return "the test's windows"; }

 private:
  const Windows& w_;
};

DocumentOptions documents(bool mask, bool reset) {
  DocumentOptions o;
  o.mask = mask;
  o.reset_positions = reset;
  o.eos_token_id = kEos;
  return o;
}

// Each document of each window alone, on `ref` (one rank), gradients summed from zero: the
// windows cut after every EOS; a document's tokens keep their labels inside it, its EOS's label
// is unscored, and the window's last document keeps the window's last label (it goes on past
// the window). Positions from 0 with `reset`, else the window's. Returns the summed loss over
// `loss_tokens` and counts the scored tokens into `scored`.
double documents_alone(TrainingRun& ref, const Windows& w, bool reset, int64_t loss_tokens,
                       int64_t& scored) {
  ref.model->params().zero_grads(ref.stream);
  double loss = 0;
  scored = 0;
  for (int64_t b = 0; b < kBatch; ++b) {
    const int64_t* ids = w.ids.data() + b * kSeq;
    int64_t begin = 0;
    for (int64_t t = 0; t < kSeq; ++t) {
      const bool last = ids[t] == kEos || t == kSeq - 1;
      if (!last) continue;
      LocalBatch doc;
      doc.batch = 1;
      doc.local_seq_len = t + 1 - begin;
      for (int64_t s = begin; s <= t; ++s) {
        doc.input_ids.push_back(ids[s]);
        doc.positions.push_back(reset ? s - begin : s);
        doc.labels.push_back(s < t            ? ids[s + 1]
                             : ids[t] == kEos ? kIgnoreLabel
                                              : w.labels[static_cast<size_t>(b * kSeq + t)]);
      }
      const int64_t n = count_scored(doc.labels);
      if (n > 0) {  // a lone EOS scores nothing (and the auxiliary losses are off)
        ref.load(doc, 1, doc.local_seq_len, loss_tokens);
        loss += ref.model->forward_backward(ref.batch, loss_tokens);
        scored += n;
      }
      begin = t + 1;
    }
  }
  return loss;
}

struct DocumentCase {
  int world, ep, sp, ds;
  bool bounded;
  LayoutModel model;
  bool reset;
  ParallelDegrees degrees() const { return {world, ep, sp, ds}; }
};

std::string name_of(const DocumentCase& c) {
  const char* model[] = {"mixtral", "qwen3", "qwen3_tied", "gpt_oss", "deepseek_v3"};
  return "W" + std::to_string(c.world) + "_ep" + std::to_string(c.ep) + "_sp" +
         std::to_string(c.sp) + "_ds" + std::to_string(c.ds) +
         (c.bounded ? "_bounded_" : "_standard_") + model[static_cast<int>(c.model)] +
         (c.reset ? "_reset" : "_window_positions");
}

void PrintTo(const DocumentCase& c, std::ostream* os) { *os << name_of(c); }

ModelConfig document_model(LayoutModel which) {
  ModelConfig m = test_support::model_of(which);
  m.router_aux_loss_coef = 0;
  m.router_bias_update_rate = 0;
  m.eos_token_id = kEos;
  return m;
}

class TrainDocuments : public ::testing::TestWithParam<DocumentCase> {};

TEST_P(TrainDocuments, StepEqualsEachDocumentAlone) {
  const DocumentCase c = GetParam();
  const RankInfo job = init_process_group();
  const RankInfo ranks = c.world == 1 ? RankInfo{} : job;
  if (c.world > 1 && ranks.world_size != c.world)
    GTEST_SKIP() << "a layout of " << c.world << " ranks";
  const ModelConfig cfg = document_model(c.model);
  const Windows w = packed_windows(cfg.vocab_size);
  const DocumentOptions options = documents(true, c.reset);

  // The batch's scored tokens, from the whole batch read as one rank would.
  WindowsLoader loader(w);
  const LocalBatch whole = read_local_batch(loader, loader.whole_batch(), options);
  const int64_t loss_tokens = count_scored(whole.labels);

  TrainingRun ref(RankInfo{}, cfg, SchedulesConfig{});
  int64_t alone_scored = 0;
  const double alone_loss = documents_alone(ref, w, c.reset, loss_tokens, alone_scored);
  ASSERT_EQ(alone_scored, loss_tokens) << "the masked labels score what the documents alone do";

  const SchedulesConfig schedules =
      c.bounded ? test_support::bounded_schedules() : SchedulesConfig{};
  TrainingRun packed(ranks, cfg, schedules, DType::f32, 11,
                     c.world > 1 ? std::optional<ParallelDegrees>(c.degrees()) : std::nullopt);
  const int W = packed.comm->world_size();
  const BatchBlock block = rank_batch_block(kBatch, kSeq, W, packed.comm->rank(),
                                            packed.model->groups().degrees().sequence);
  const LocalBatch local = read_local_batch(loader, block, options);
  ASSERT_EQ(local.doc_start.size(), static_cast<size_t>(block.rows * kSeq));
  packed.load(local, kBatch, kSeq, loss_tokens);
  packed.model->params().zero_grads(packed.stream);
  const double loss = packed.model->forward_backward(packed.batch, loss_tokens);
  EXPECT_LT(rel(loss, alone_loss), 1e-5) << loss << " vs the documents alone " << alone_loss;

  double worst_grad = 0;
  const ParamLayout& layout = ref.model->params().layout();
  for (size_t p = 0; p < layout.params().size(); ++p) {
    const int i = static_cast<int>(p);
    const std::vector<double> got = packed.gathered(i, packed.model->params().flat_grads());
    const std::vector<double> want = ref.gathered(i, ref.model->params().flat_grads());
    const double err = test_support::scaled_error(got, want);
    worst_grad = std::max(worst_grad, err);
    EXPECT_LT(err, 1e-5) << layout.params()[p].name;
  }

  // The control: the same windows attended across their documents give another step.
  LocalBatch unmasked = read_local_batch(loader, block, documents(false, c.reset));
  unmasked.labels = local.labels;  // the same scored tokens
  packed.load(unmasked, kBatch, kSeq, loss_tokens);
  packed.model->params().zero_grads(packed.stream);
  const double crossing = packed.model->forward_backward(packed.batch, loss_tokens);
  EXPECT_GT(rel(crossing, alone_loss), 1e-3) << "attending across documents changes the loss";

  if (job.rank == 0) {
    std::printf("  %s: loss %.2e relative, worst gradient %.2e (across documents: %.2e)\n",
                name_of(c).c_str(), rel(loss, alone_loss), worst_grad, rel(crossing, alone_loss));
  }
}

std::vector<DocumentCase> document_cases() {
  std::vector<DocumentCase> cases;
  for (bool reset : {true, false}) {
    for (LayoutModel model :
         {LayoutModel::mixtral, LayoutModel::gpt_oss, LayoutModel::deepseek_v3}) {
      cases.push_back({1, 1, 1, 1, false, model, reset});
      cases.push_back({4, 1, 4, 4, false, model, reset});
      cases.push_back({4, 1, 4, 4, true, model, reset});
    }
    cases.push_back({4, 2, 2, 4, true, LayoutModel::gpt_oss, reset});
    cases.push_back({4, 4, 1, 2, false, LayoutModel::gpt_oss, reset});
    cases.push_back({4, 2, 4, 2, true, LayoutModel::deepseek_v3, reset});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainDocuments, ::testing::ValuesIn(document_cases()),
                         [](const ::testing::TestParamInfo<DocumentCase>& info) {
                           return name_of(info.param);
                         });

// The gradient-accumulation job's token file (ids below 32) cut at token 5 — about one EOS a
// window of 32 — trained 3 steps in a layout, evaluated on the same file after the last.
Config trainer_config(const std::filesystem::path& dir, const std::string& name, int ep, int sp,
                      int ds, bool mask) {
  Config cfg = test_support::accum_config(dir, (dir / "tokens.bin").string(), 4, 1, 3);
  cfg.job.name = name;
  cfg.parallelism.expert_parallel = ep;
  cfg.parallelism.sequence_parallel = sp;
  cfg.parallelism.data_shard = ds;
  cfg.model.eos_token_id = 5;
  cfg.training.document_mask = mask;
  cfg.training.reset_position_ids = true;
  cfg.training.shuffle = false;
  cfg.eval.dataset_path = cfg.training.dataset_path;
  cfg.eval.batches = 2;
  check_config(cfg);
  return cfg;
}

TEST(TrainDocumentsTrainer, UlyssesEqualsWholeSequencesPerRank) {
  const RankInfo ranks = init_process_group();
  if (ranks.world_size != 4) GTEST_SKIP() << "written for 4 ranks";
  test_support::SharedRunDir dir;
  const TrainResult ulysses = train(trainer_config(dir.path(), "sp4", 1, 4, 4, true), {});
  const TrainResult whole = train(trainer_config(dir.path(), "sp1", 4, 1, 2, true), {});
  const TrainResult crossing = train(trainer_config(dir.path(), "unmasked", 1, 4, 4, false), {});
  ASSERT_EQ(ulysses.losses.size(), 3u);
  ASSERT_EQ(whole.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(rel(ulysses.losses[i], whole.losses[i]), 1e-5) << "step " << i + 1;
    EXPECT_GT(rel(crossing.losses[i], whole.losses[i]), 1e-4) << "step " << i + 1;
  }
  ASSERT_EQ(ulysses.evals.size(), 1u);
  ASSERT_EQ(whole.evals.size(), 1u);
  EXPECT_LT(rel(ulysses.evals[0].metrics.loss, whole.evals[0].metrics.loss), 1e-5);
  EXPECT_EQ(ulysses.evals[0].metrics.tokens, whole.evals[0].metrics.tokens);
  EXPECT_LT(ulysses.evals[0].metrics.tokens, crossing.evals[0].metrics.tokens)
      << "the EOS positions' labels are not scored";
  if (ranks.rank == 0) {
    std::printf("  trainer: losses %.6f %.6f %.6f (Sp 4) vs %.6f %.6f %.6f (Sp 1); unmasked %.6f\n",
                ulysses.losses[0], ulysses.losses[1], ulysses.losses[2], whole.losses[0],
                whole.losses[1], whole.losses[2], crossing.losses[0]);
  }
}

}  // namespace
}  // namespace moepeak
