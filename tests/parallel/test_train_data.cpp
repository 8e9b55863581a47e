// The Trainer's data on W real rank processes: each rank reads only its block of the batch, so a
// bad token id that one rank's block holds is seen by that rank alone — and still stops every
// rank at that step (the ranks agree before the step's first collective): that rank with the
// error naming the file, offset and value, the others naming that rank; the step before it ran.
// A blend of two files trains on 4 ranks, logs each dataset's share in metrics.jsonl and resumes
// from a checkpoint bit for bit (shuffled order, the default). With the four bounded schedules
// on 4 ranks, evaluation leaves the training losses bitwise unchanged and its peak per live set
// stays inside the plan's term.
// Run: ctest -R test_train_data --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/config.h"
#include "core/error.h"
#include "core/plan/plan.h"
#include "core/train/trainer.h"
#include "tests/expect_contains.h"
#include "tests/parallel/shared_run_dir.h"
#include "tests/train_checks.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::SharedRunDir;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// 1,024 tokens < 32 with one 40 at stream position `bad` (rank 0 writes, every rank waits).
std::string write_tokens_with_bad_id(const fs::path& dir, size_t bad) {
  const fs::path path = dir / "bad_id.bin";
  if (world_rank() == 0) {
    std::vector<uint16_t> tokens(1024);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 5) % 32);
    tokens[bad] = 40;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * 2));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path.string();
}

TEST(TrainData, ABadIdInOneRanksBlockStopsEveryRankAtThatStep) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "the block arithmetic below is for 4 ranks";
  SharedRunDir dir;
  // B = 4, T = 32 in file order: step 2 reads stream [128, 256]; with Sp = W = 4 rank r holds
  // columns [8r, 8r + 8) of each row and reads 9 tokens. Row 0 of step 2 is [128, 160]: rank 2
  // reads [144, 152], rank 1 [136, 144], rank 3 [152, 160]; 148 is rank 2's alone.
  const std::string tokens = write_tokens_with_bad_id(dir.path(), 148);
  Config cfg = load_config(
      {}, {"job.run_dir=" + dir.path().string(), "job.name=bad_id", "training.steps=3",
           "training.seq_len=32", "training.batch_size=4", "training.dataset=\"bin\"",
           "training.dataset_path=\"" + tokens + "\"", "training.shuffle=false",
           "model.vocab_size=32", "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
  std::string error;
  try {
    train(cfg, {});
  } catch (const Error& e) {
    error = e.what();
  }
  if (world_rank() == 2) {
    EXPECT_CONTAINS(error,
                    tokens + ": token 40 at offset 148 (byte 296) is >= model.vocab_size 32");
  } else {
    EXPECT_CONTAINS(error, "step 2: rank 2 could not read its block of the batch");
  }
  if (world_rank() == 0) {  // step 1 ran and was logged
    EXPECT_EQ(test_support::metrics_line_count(dir.path() / "bad_id" / "metrics.jsonl"), 1);
  }
}

TEST(TrainData, ABlendOnWRanksLogsItsSharesAndResumesBitForBit) {
  SharedRunDir dir;
  const std::string first = (dir.path() / "tokens.bin").string();  // SharedRunDir's 20,000
  const fs::path second = dir.path() / "second.bin";
  if (world_rank() == 0) {
    std::vector<uint16_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 3) % 32);
    std::ofstream(second, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * 2));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Config cfg = load_config(
      {}, {"job.run_dir=" + dir.path().string(), "job.name=blend", "training.steps=4",
           "training.seq_len=32", "training.batch_size=4", "training.dataset=\"bin\"",
           "training.datasets=[{ path = \"" + first + "\", weight = 0.75 }, { path = \"" +
               second.string() + "\", weight = 0.25 }]",
           "model.vocab_size=32", "checkpoint.enable=true", "checkpoint.interval=2",
           "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 4u);
  if (world_rank() == 0) {
    std::ifstream metrics(dir.path() / "blend" / "metrics.jsonl");
    std::vector<nlohmann::json> steps;
    for (std::string line; std::getline(metrics, line);) {
      if (!line.empty()) steps.push_back(nlohmann::json::parse(line));
    }
    ASSERT_EQ(steps.size(), 4u);
    const nlohmann::json& data = steps.back().at("data");  // 16 sequences: 12 and 4
    ASSERT_EQ(data.size(), 2u);
    EXPECT_EQ(data[0].at("path"), first);
    EXPECT_EQ(data[0].at("samples"), 12);
    EXPECT_EQ(data[1].at("samples"), 4);
    EXPECT_EQ(data[0].at("share"), 0.75);
    EXPECT_EQ(data[1].at("weight"), 0.25);
  }
  test_support::expect_resumes_bit_for_bit(cfg, "blend_resumed", full, 2);
}

TEST(TrainData, EvaluationWithTheBoundedSchedulesChangesNothingAndFitsThePlan) {
  SharedRunDir dir;
  const std::string tokens = (dir.path() / "tokens.bin").string();  // 20,000 tokens < 32
  auto config = [&](const std::string& name, bool eval) {
    std::vector<std::string> sets = {"job.run_dir=" + dir.path().string(),
                                     "job.name=" + name,
                                     "training.steps=4",
                                     "training.seq_len=32",
                                     "training.batch_size=4",
                                     "training.dataset=\"bin\"",
                                     "training.dataset_path=\"" + tokens + "\"",
                                     "model.vocab_size=32",
                                     "schedules.dispatch=pipelined_llep",
                                     "schedules.vocab=ring_dtp",
                                     "schedules.checkpoint=sco",
                                     "optimizer.placement=offload_stream",
                                     "metrics.progress=\"off\"",
                                     "runtime.log_level=\"warn\""};
    if (eval) {
      // The same file held out: a different stretch of it from the shuffled training windows.
      sets.insert(sets.end(),
                  {"eval.dataset_path=\"" + tokens + "\"", "eval.interval=1", "eval.batches=2"});
    }
    return load_config({}, sets);
  };
  const Config with_eval = config("bounded_eval", true);
  const TrainResult a = train(with_eval, {});
  const TrainResult b = train(config("bounded", false), {});
  ASSERT_EQ(a.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  ASSERT_EQ(a.evals.size(), 4u);
  const Plan plan = make_plan(with_eval, plan_inputs(with_eval, 4));
  for (const TrainResult::Evaluation& e : a.evals) {
    EXPECT_TRUE(std::isfinite(e.metrics.loss));
    EXPECT_EQ(e.metrics.tokens, 2 * 4 * 32);
    for (LiveSet set : kAllLiveSets)
      EXPECT_LE(e.metrics.peak_per_set[set], plan.term(set).bytes) << live_set_name(set);
  }
}

}  // namespace
}  // namespace moepeak
