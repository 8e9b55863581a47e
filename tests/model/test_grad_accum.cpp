// Gradient accumulation (training.grad_accum_steps = m) on the CPU: a step of m micro-batches of
// B sequences trains as one step of m B sequences (the losses of every step, the gradients of
// step 1 within 1e-6 relative in fp32: the sums run in another order), and a resumed run
// continues bit for bit, its data cursor counted in micro-batches.
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

TEST(GradAccum, ZeroMicroBatchesIsAConfigError) {
  EXPECT_THROW(load_config({}, {"training.grad_accum_steps=0"}), Error);
}

}  // namespace
}  // namespace moepeak
