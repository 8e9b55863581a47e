// Evaluation during training (eval.*, Trainer::evaluate) on one process: it runs every
// eval.interval steps and at the end; it changes nothing training reads (the losses with and
// without it are bitwise equal); its loss is the training forward's (the evaluation after step 2
// on step 3's batch equals step 3's training loss, bitwise); the metrics file and the console
// line carry it; its peak per live set is inside the training plan's term; and every bad data
// input is an error naming the file before the first step, with no metrics written.
// Run: ctest -R test_train_eval
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/config.h"
#include "core/data/data_loader.h"
#include "core/error.h"
#include "core/metrics/step_metrics.h"
#include "core/plan/plan.h"
#include "core/train/trainer.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::error_of;
using test_support::TempDir;

constexpr int64_t kB = 4, kT = 32;

// A headerless uint16 file of `tokens`.
std::string write_tokens(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(tokens.size() * 2));
  return path.string();
}

// Random-looking tokens < 32 with a learnable pattern (each token repeats 5 later).
std::vector<uint16_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint16_t> t(n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = i >= 5 ? t[i - 5] : static_cast<uint16_t>((x >> 16) % 32);
    if (i % 7 == 0) t[i] = static_cast<uint16_t>((x >> 20) % 32);
  }
  return t;
}

Config eval_config(const fs::path& dir, const std::string& name, const std::string& train_file,
                   const std::string& eval_file, int64_t steps,
                   std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"job.run_dir=" + dir.string(),
                                   "job.name=" + name,
                                   "training.steps=" + std::to_string(steps),
                                   "training.seq_len=" + std::to_string(kT),
                                   "training.batch_size=" + std::to_string(kB),
                                   "training.dataset=bin",
                                   "training.dataset_path=" + train_file,
                                   "training.shuffle=false",
                                   "model.vocab_size=32",
                                   "metrics.progress=off",
                                   "runtime.log_level=warn"};
  if (!eval_file.empty()) sets.push_back("eval.dataset_path=" + eval_file);
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config({}, sets);
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

TEST(TrainEval, RunsAtTheIntervalAndTheEndWithoutChangingTraining) {
  TempDir dir;
  const std::vector<uint16_t> stream = pattern(5 * kB * kT + 1, 3);
  const std::string train_file = write_tokens(dir.path() / "train.bin", stream);
  // The held-out set is step 3's batch: stream [2BT, 3BT].
  const std::string eval_file = write_tokens(
      dir.path() / "heldout.bin",
      std::vector<uint16_t>(stream.begin() + 2 * kB * kT, stream.begin() + 3 * kB * kT + 1));
  const Config with = eval_config(dir.path(), "with", train_file, eval_file, 5,
                                  {"eval.interval=2", "eval.batches=1"});
  const TrainResult a = train(with, {});
  const TrainResult b = train(eval_config(dir.path(), "without", train_file, "", 5), {});
  ASSERT_EQ(a.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;

  ASSERT_EQ(a.evals.size(), 3u) << "after steps 2 and 4, and at the end";
  EXPECT_EQ(a.evals[0].step, 2);
  EXPECT_EQ(a.evals[1].step, 4);
  EXPECT_EQ(a.evals[2].step, 5);
  EXPECT_EQ(a.evals[0].metrics.loss, a.losses[2])
      << "the evaluation after step 2 of step 3's batch is step 3's training loss";
  EXPECT_EQ(a.evals[0].metrics.tokens, kB * kT);
  EXPECT_DOUBLE_EQ(a.evals[0].metrics.perplexity, std::exp(a.evals[0].metrics.loss));
  EXPECT_LT(a.evals[2].metrics.loss, a.evals[0].metrics.loss) << "training lowers it";

  const std::vector<nlohmann::json> lines = metrics_lines(a.metrics_file);
  ASSERT_EQ(lines.size(), 5u);
  for (const nlohmann::json& j : lines) {
    const int64_t step = j.at("step");
    const bool evaluated = step == 2 || step == 4 || step == 5;
    EXPECT_EQ(j.contains("eval_loss"), evaluated) << "step " << step;
    if (evaluated) {
      for (const char* key : {"eval_perplexity", "eval_tokens", "eval_time_s", "eval_peak_bytes"})
        EXPECT_TRUE(j.contains(key)) << key;
    }
  }
  EXPECT_EQ(lines[1].at("eval_loss").get<double>(), a.evals[0].metrics.loss);
  StepMetrics m = a.last;
  EXPECT_CONTAINS(step_metrics_line(m), "eval_loss: ");
  EXPECT_CONTAINS(step_metrics_line(m), "eval_ppl: ");
}

TEST(TrainEval, ItsPeakPerLiveSetIsInsideTheTrainingPlan) {
  TempDir dir;
  const std::string train_file = write_tokens(dir.path() / "train.bin", pattern(4000, 5));
  const std::string eval_file = write_tokens(dir.path() / "heldout.bin", pattern(2000, 9));
  for (const char* checkpoint : {"standard", "sco"}) {
    SCOPED_TRACE(checkpoint);
    const Config cfg =
        eval_config(dir.path(), std::string("plan_") + checkpoint, train_file, eval_file, 2,
                    {"eval.batches=3", std::string("schedules.checkpoint=") + checkpoint});
    const TrainResult r = train(cfg, {});
    ASSERT_EQ(r.evals.size(), 1u);
    const EvalMetrics& e = r.evals[0].metrics;
    const Plan plan = make_plan(cfg, plan_inputs(cfg, 1));
    for (LiveSet set : kAllLiveSets) {
      EXPECT_LE(e.peak_per_set[set], plan.term(set).bytes) << live_set_name(set);
      EXPECT_LE(e.peak_per_set[set], r.last.peak_per_set[set])
          << live_set_name(set) << ": no more than the training step's own";
    }
    EXPECT_LE(e.peak_total, plan.total);
  }
}

TEST(TrainEval, BadDataIsAnErrorNamingTheFileBeforeTheFirstStep) {
  TempDir dir;
  const std::string good = write_tokens(dir.path() / "train.bin", pattern(4000, 5));
  auto fails_before_step_one = [&](const Config& cfg) {
    const std::string error = error_of([&] { train(cfg, {}); });
    EXPECT_FALSE(fs::exists(fs::path(cfg.job.run_path()) / "metrics.jsonl"))
        << "nothing written: " << error;
    return error;
  };
  // An empty file, and one shorter than one window.
  const std::string empty = write_tokens(dir.path() / "empty.bin", {});
  EXPECT_CONTAINS(fails_before_step_one(eval_config(dir.path(), "e1", empty, "", 2)),
                  empty + ": 0 tokens");
  const std::string tiny = write_tokens(dir.path() / "tiny.bin", pattern(20, 1));
  EXPECT_CONTAINS(fails_before_step_one(eval_config(dir.path(), "e2", tiny, "", 2)),
                  tiny + ": 20 tokens, fewer than training.seq_len + 1 = 33");
  // An eval set too short for eval.batches, a missing one, one of another token type.
  const std::string short_eval = write_tokens(dir.path() / "short.bin", pattern(300, 1));
  EXPECT_CONTAINS(
      fails_before_step_one(eval_config(dir.path(), "e3", good, short_eval, 2, {"eval.batches=3"})),
      "eval.dataset_path " + short_eval +
          " holds 300 tokens, fewer than eval.batches x "
          "training.batch_size x training.seq_len + 1 = 385");
  const std::string missing = (dir.path() / "missing.bin").string();
  EXPECT_CONTAINS(fails_before_step_one(eval_config(dir.path(), "e4", good, missing, 2)),
                  "missing.bin");
  // llm.c's headers name the token type: a GPT-2 (uint16) training file, a Llama 3 (uint32)
  // held-out one.
  auto llmc = [&](const std::string& name, int32_t magic, int32_t version, size_t width) {
    std::vector<uint8_t> bytes(1024, 0);
    const int32_t header[3] = {magic, version, 2000};
    std::memcpy(bytes.data(), header, sizeof header);
    bytes.resize(1024 + 2000 * width, 1);
    const fs::path p = dir.path() / name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p.string();
  };
  const std::string gpt2 = llmc("gpt2.bin", 20240520, 1, 2);
  const std::string llama = llmc("llama.bin", 20240801, 7, 4);
  EXPECT_CONTAINS(
      fails_before_step_one(eval_config(dir.path(), "e5", gpt2, llama, 2,
                                        {"training.token_dtype=llmc", "model.vocab_size=300"})),
      "eval.dataset_path " + llama + " stores uint32 token ids, but training.dataset_path " + gpt2 +
          " stores uint16");
  // Eval needs a token file's format.
  EXPECT_CONTAINS(error_of([&] { load_config({}, {"eval.dataset_path=" + good}); }),
                  "is not a token file's");
}

}  // namespace
}  // namespace moepeak
