// Gradient accumulation (training.grad_accum_steps = m) on the CPU: a step of m micro-batches of
// B sequences trains as one step of m B sequences (the losses of every step, the gradients of
// step 1 within 1e-6 relative in fp32: the sums run in another order), and a resumed run
// continues bit for bit, its data cursor counted in micro-batches. The same on the default job
// (the tiny preset on the copy task, indexed by sample): its step 1 of B = 4, m = 2 (and 2, 4)
// reads the 8 sequences of B = 8, m = 1, bitwise, and its loss is theirs within 1e-6; a
// checkpoint of B = 4, m = 2 resumes bit for bit, and as B = 8, m = 1 on the same sequences.
// Run: ctest -R test_grad_accum
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/model/param_layout.h"
#include "core/train/trainer.h"
#include "tests/grad_accum_job.h"
#include "tests/temp_dir.h"
#include "tests/train_checks.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::accum_config;
using test_support::TempDir;

template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& file, const std::string& name) {
  std::vector<T> out(file.info(name).bytes / sizeof(T));
  file.read(name, out.data(), out.size() * sizeof(T));
  return out;
}

// max |a - b| over max |b| of every tensor (f32) of two safetensors files.
double max_relative_difference(const fs::path& a_path, const fs::path& b_path) {
  auto a = SafetensorsFile::open(a_path.string());
  auto b = SafetensorsFile::open(b_path.string());
  double worst = 0;
  for (const std::string& name : b.names()) {
    const std::vector<float> x = read_tensor<float>(a, name), y = read_tensor<float>(b, name);
    EXPECT_EQ(x.size(), y.size()) << name;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      diff = std::max(diff, std::abs(double(x[i]) - double(y[i])));
      scale = std::max(scale, std::abs(double(y[i])));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

TEST(GradAccum, MicroBatchesTrainAsOneBatchOfMTimesTheSequences) {
  TempDir dir;
  const std::string tokens = test_support::write_accum_tokens(dir.path());
  struct Run {
    int64_t batch, accum;
  };
  const Run runs[] = {{8, 1}, {4, 2}, {2, 4}, {1, 8}};
  std::vector<TrainResult> results;
  for (const Run& run : runs) {
    const std::string name = "b" + std::to_string(run.batch) + "_m" + std::to_string(run.accum);
    Config cfg = accum_config(dir.path(), tokens, run.batch, run.accum, 4);
    cfg.job.name = name;
    TrainOptions options;
    options.dump_step_dir = (dir.path() / ("dump_" + name)).string();
    results.push_back(train(cfg, options));
    ASSERT_EQ(results.back().losses.size(), 4u) << name;
  }
  const fs::path reference = dir.path() / "dump_b8_m1";
  for (size_t r = 1; r < results.size(); ++r) {
    const std::string name =
        "b" + std::to_string(runs[r].batch) + "_m" + std::to_string(runs[r].accum);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(results[r].losses[i], results[0].losses[i], 1e-6 * results[0].losses[i])
          << name << " step " << i + 1;
    }
    // The step's batch is the m micro-batches together, and its gradients are theirs summed.
    const fs::path dump = dir.path() / ("dump_" + name);
    auto batch = SafetensorsFile::open((dump / "batch.safetensors").string());
    EXPECT_EQ(batch.info("input_ids").shape, (std::vector<int64_t>{8, 32})) << name;
    EXPECT_EQ(read_tensor<int64_t>(batch, "input_ids"),
              read_tensor<int64_t>(
                  SafetensorsFile::open((reference / "batch.safetensors").string()), "input_ids"))
        << name;
    EXPECT_LE(max_relative_difference(dump / "grads.safetensors", reference / "grads.safetensors"),
              1e-6)
        << name;
  }
}

TEST(GradAccum, ResumeContinuesBitForBitCountingMicroBatches) {
  TempDir dir;
  const std::string tokens = test_support::write_accum_tokens(dir.path());
  Config cfg = accum_config(dir.path(), tokens, 2, 3, 6);
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 3;
  cfg.checkpoint.keep_latest = 3;
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 6u);

  Config resumed_cfg = cfg;
  resumed_cfg.job.name = "resumed";
  TrainOptions options;
  options.resume_from = (fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(3)).string();
  const TrainResult resumed = train(resumed_cfg, options);
  ASSERT_EQ(resumed.first_step, 4);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed.losses[i], full.losses[3 + i]) << "step " << 4 + i;
  }
}

TEST(GradAccum, TheCopyTasksStepIsTheSameBatchForAnyAccumulation) {
  // The tiny preset, one step, seed 1234 both: B = 8, m = 1 against B = 4, m = 2 (and 2, 4).
  TempDir dir;
  struct Run {
    int64_t batch, accum;
  };
  const Run runs[] = {{8, 1}, {4, 2}, {2, 4}};
  std::vector<TrainResult> results;
  for (const Run& run : runs) {
    const std::string name = "b" + std::to_string(run.batch) + "_m" + std::to_string(run.accum);
    Config cfg = test_support::copy_accum_config(dir.path(), run.batch, run.accum, 1);
    cfg.job.name = name;
    ASSERT_EQ(cfg.training.dataset, DatasetKind::copy);
    TrainOptions options;
    options.dump_step_dir = (dir.path() / ("dump_" + name)).string();
    results.push_back(train(cfg, options));
    ASSERT_EQ(results.back().losses.size(), 1u) << name;
  }
  auto batch_of = [&](size_t r) {
    const std::string name =
        "b" + std::to_string(runs[r].batch) + "_m" + std::to_string(runs[r].accum);
    return SafetensorsFile::open((dir.path() / ("dump_" + name) / "batch.safetensors").string());
  };
  const SafetensorsFile reference = batch_of(0);
  const std::vector<int64_t> ids = read_tensor<int64_t>(reference, "input_ids");
  const std::vector<int64_t> labels = read_tensor<int64_t>(reference, "labels");
  ASSERT_EQ(ids.size(), 8u * 128u);
  // A real copy-task batch: 8 different sequences, each its prefix of 64 twice.
  for (int64_t b = 0; b < 8; ++b) {
    EXPECT_TRUE(
        std::equal(ids.begin() + b * 128, ids.begin() + b * 128 + 64, ids.begin() + b * 128 + 64));
    if (b > 0) {
      EXPECT_FALSE(std::equal(ids.begin(), ids.begin() + 128, ids.begin() + b * 128)) << b;
    }
  }
  for (size_t r = 1; r < results.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "B " << runs[r].batch << " m " << runs[r].accum);
    const SafetensorsFile batch = batch_of(r);
    EXPECT_EQ(batch.info("input_ids").shape, (std::vector<int64_t>{8, 128}));
    EXPECT_EQ(read_tensor<int64_t>(batch, "input_ids"), ids);  // bitwise: the same sequences
    EXPECT_EQ(read_tensor<int64_t>(batch, "labels"), labels);
    // The loss is the mean over the step's scored tokens either way (each micro-batch's sum is
    // divided by the whole step's count, 8 x 65), so only the order of the sums differs: per
    // micro-batch partial sums, then the m of them, against one sum — fp32 rounding, not
    // bitwise. Measured: 1.6e-16 relative for m = 2, 8.3e-10 for m = 4.
    EXPECT_NEAR(results[r].losses[0], results[0].losses[0], 1e-6 * results[0].losses[0]);
  }
  // Step 1 of an untrained model: about ln(256) = 5.55 on the scored half.
  EXPECT_NEAR(results[0].losses[0], std::log(256.0), 0.5);
}

TEST(GradAccum, TheCopyTaskResumesBitForBitAndAtAnotherAccumulation) {
  // B = 4, m = 2 for 4 steps, checkpointed after step 2; resumed as it ran (bit for bit) and as
  // B = 8, m = 1 (the cursor is a sample index: the same sequences, so the losses within the
  // summation-order tolerance above — measured 0 and 1.7e-9 relative; the weights after step 2
  // are the checkpoint's either way).
  TempDir dir;
  Config cfg = test_support::copy_accum_config(dir.path(), 4, 2, 4);
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 2;
  cfg.checkpoint.keep_latest = 2;
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 4u);
  test_support::expect_resumes_bit_for_bit(cfg, "resumed", full, 2);

  Config wider = test_support::copy_accum_config(dir.path(), 8, 1, 4);
  wider.job.name = "resumed_b8_m1";
  TrainOptions options;
  options.resume_from = (fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(2)).string();
  const TrainResult resumed = train(wider, options);
  ASSERT_EQ(resumed.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(resumed.losses[i], full.losses[2 + i], 1e-6 * full.losses[2 + i])
        << "step " << 3 + i;
  }
}

TEST(GradAccum, ZeroMicroBatchesIsAConfigError) {
  EXPECT_THROW(load_config({}, {"training.grad_accum_steps=0"}), Error);
}

}  // namespace
}  // namespace moepeak
