// Gradient accumulation on W real rank processes (the Trainer end to end: ZeRO-3, sequence and
// expert parallel): m micro-batches of B sequences train as one batch of m B — every step's loss
// and grad norm within 1e-6 relative — and a run checkpointed on W ranks resumes bit for bit,
// its data cursor counted in micro-batches. Rank 0 makes the run directory and the token file and
// tells the others where they are. Run: ctest -R train_grad_accum --output-on-failure
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/config/config.h"
#include "core/train/trainer.h"
#include "tests/grad_accum_job.h"
#include "tests/parallel/shared_run_dir.h"
#include "tests/train_checks.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::SharedRunDir;

Config accum_config(const fs::path& dir, const std::string& name, int64_t batch, int64_t accum,
                    int64_t steps) {
  Config cfg = test_support::accum_config(dir, (dir / "tokens.bin").string(), batch, accum, steps);
  cfg.job.name = name;
  return cfg;
}

TEST(TrainGradAccum, MicroBatchesOnWRanksTrainAsOneBatchOfMTimesTheSequences) {
  SharedRunDir dir;
  const TrainResult one = train(accum_config(dir.path(), "b8_m1", 8, 1, 4), {});
  const TrainResult two = train(accum_config(dir.path(), "b4_m2", 4, 2, 4), {});
  ASSERT_EQ(one.losses.size(), 4u);
  ASSERT_EQ(two.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(two.losses[i], one.losses[i], 1e-6 * one.losses[i]) << "step " << i + 1;
  }
}

TEST(TrainGradAccum, ACheckpointOnWRanksResumesBitForBit) {
  SharedRunDir dir;
  Config cfg = accum_config(dir.path(), "full", 4, 2, 4);
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 2;
  cfg.checkpoint.keep_latest = 2;
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 4u);
  test_support::expect_resumes_bit_for_bit(cfg, "resumed", full, 2);
}

}  // namespace
}  // namespace moepeak
