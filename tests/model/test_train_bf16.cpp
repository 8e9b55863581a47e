// bf16 training on the CPU backend end to end (docs/design.md, "bf16 on the CPU"): the tiny
// preset's first 50 steps in bf16 track the fp32 run's loss curve within a stated bound, a bf16
// run learns the copy task (a smaller one, learned within 100 steps at every seed tried), and a
// bf16 run's checkpoint keeps the fp32 master weights and the fp32 AdamW moments, says in its
// config.json the dtype of the weights beside it, and resumes bit for bit; every optimizer
// placement (resident, offload_serial, offload_stream) trains and resumes a bf16 run alike.
// Run: ctest -R test_train_bf16
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/model/param_layout.h"
#include "core/train/trainer.h"
#include "tests/source_dir.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::TempDir;

const std::string kSourceDir = test_support::source_dir();

Config tiny(const fs::path& run_dir, const std::string& dtype, int64_t steps) {
  return load_config({kSourceDir + "/configs/tiny.toml"},
                     {"job.run_dir=" + run_dir.string(), "job.name=\"" + dtype + "\"",
                      "training.dtype=\"" + dtype + "\"", "training.steps=" + std::to_string(steps),
                      "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
}

// NOTES: the bound. Both runs start from the same fp32 initialisation (bf16 rounds it) and read
// the same batches; bf16 rounds every stored activation, so the losses part by bf16's rounding
// at once and then by what the optimizer does with slightly different gradients. Measured
// (2-core VM, the copy task indexed by sample): within 1.1e-3 relative through step 30 and
// 6.8e-3 through 50, the loss flat near ln(V) throughout — at this seed the copy task starts to
// be learned near step 80, and when it starts is chaotic (other seeds: 0.8e-3 to 6.9e-3 through
// step 30), which is why learning is checked on the smaller task below. (With the copy task's
// earlier (micro-batch, row) key it started before step 40: 7.5e-4 through 30, 1.1e-2 at 50,
// with bf16 main grads 2.1e-2.) Bounds: 2e-3 through step 30, 3e-2 through 50.
TEST(TrainBf16, FiftyStepsOfTheTinyPresetTrackTheFp32LossCurve) {
  TempDir dir;
  const TrainResult f32 = train(tiny(dir.path(), "float32", 50), {});
  const TrainResult bf16 = train(tiny(dir.path(), "bfloat16", 50), {});
  ASSERT_EQ(f32.losses.size(), 50u);
  ASSERT_EQ(bf16.losses.size(), 50u);
  double early = 0, late = 0;
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_TRUE(std::isfinite(bf16.losses[i])) << "step " << i + 1;
    const double rel = std::abs(bf16.losses[i] - f32.losses[i]) / std::abs(f32.losses[i]);
    (i < 30 ? early : late) = std::max(i < 30 ? early : late, rel);
    EXPECT_LE(rel, i < 30 ? 2e-3 : 3e-2)
        << "step " << i + 1 << ": bf16 " << bf16.losses[i] << ", fp32 " << f32.losses[i];
  }
  std::printf("  bf16 vs fp32 loss: max rel %.2e through step 30, %.2e through 50\n", early, late);
}

// A bf16 run learns: the copy task over a vocabulary of 32, 16 sequences of 32 tokens, 100 steps
// (test_train's task, which it learns in fp32). Measured (2-core VM, `moepeak train`), the mean
// loss of steps 96-100 at seeds 1234, 1, 2: bf16 0.043, 0.025, 0.032 (fp32 0.020, 0.053, 0.017),
// from ln(32) = 3.47. The bound, 0.25, is far below what a model that does not copy can reach
// (the 17 scored positions of 32 then cost about ln(32) each: 3.47).
TEST(TrainBf16, ABf16RunLearnsTheCopyTask) {
  TempDir dir;
  const TrainResult r =
      train(load_config({}, {"job.run_dir=" + dir.path().string(), "training.steps=100",
                             "training.seq_len=32", "training.batch_size=16", "model.vocab_size=32",
                             "training.dtype=\"bfloat16\"", "metrics.progress=\"off\"",
                             "runtime.log_level=\"warn\""}),
            {});
  ASSERT_EQ(r.losses.size(), 100u);
  EXPECT_GT(r.losses.front(), 3.0);
  double last5 = 0;
  for (size_t i = 95; i < 100; ++i) last5 += r.losses[i] / 5;
  EXPECT_LT(last5, 0.25);
  std::printf("  bf16 copy task (V = 32): loss %.3f at step 1, %.3f over steps 96-100\n",
              r.losses.front(), last5);
}

// A bf16 run's checkpoint: weights in BF16, the fp32 master and both moments in F32 (the step
// continues from every bit of them), config.json's dtype and torch_dtype "bfloat16"; a run
// resumed from step 4 gives steps 5..8 bit for bit.
// The embedded default model in bf16, 8 steps, a checkpoint every 4.
Config bf16_run(const fs::path& run_dir) {
  return load_config({},
                     {"job.run_dir=" + run_dir.string(), "training.steps=8", "training.seq_len=32",
                      "training.batch_size=8", "model.vocab_size=32", "training.dtype=\"bfloat16\"",
                      "checkpoint.enable=true", "checkpoint.interval=4", "metrics.progress=\"off\"",
                      "runtime.log_level=\"warn\""});
}

TEST(TrainBf16, CheckpointKeepsTheFp32MasterAndStateAndResumesBitForBit) {
  TempDir dir;
  const Config cfg = bf16_run(dir.path());
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 8u);
  const fs::path ckpt = fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(4);
  {
    ShardedCheckpoint state(ckpt.string());
    const ParamLayout layout(cfg.model);
    for (const ParamInfo& p : layout.params()) {
      EXPECT_EQ(state.manifest().tensor(p.name, "test").dtype, DType::bf16) << p.name;
      for (const char* prefix : {"master.", "exp_avg.", "exp_avg_sq."}) {
        EXPECT_EQ(state.manifest().tensor(prefix + p.name, "test").dtype, DType::f32)
            << prefix << p.name;
      }
    }
    const nlohmann::json config = read_json_file((ckpt / "config.json").string());
    EXPECT_EQ(config.at("dtype"), "bfloat16");
    EXPECT_EQ(config.at("torch_dtype"), "bfloat16");
  }
  Config resumed_cfg = cfg;
  resumed_cfg.job.name = "resumed";
  TrainOptions options;
  options.resume_from = ckpt.string();
  const TrainResult resumed = train(resumed_cfg, options);
  ASSERT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.losses[i], full.losses[4 + i]) << "step " << 5 + i;
  }
}

// Every optimizer placement trains a bf16 run bit for bit alike — the offloads keep resident's
// fp32 master on the host, and the serial offload's host AdamW rounds it to the bf16 weights as
// the device's fused update does — and a bf16 checkpoint resumes under any of them.
TEST(TrainBf16, EveryOptimizerPlacementTrainsAndResumesBitForBit) {
  TempDir dir;
  const Config cfg = bf16_run(dir.path());
  const TrainResult resident = train(cfg, {});
  ASSERT_EQ(resident.losses.size(), 8u);
  TrainOptions from_step4;
  from_step4.resume_from =
      (fs::path(resident.run_dir) / "checkpoints" / checkpoint_dir_name(4)).string();
  for (OptimizerPlacement placement :
       {OptimizerPlacement::offload_serial, OptimizerPlacement::offload_stream}) {
    const std::string name(enum_name(placement));
    Config c = cfg;
    c.optimizer.placement = placement;
    c.job.name = name;
    const TrainResult r = train(c, {});
    EXPECT_EQ(r.losses, resident.losses) << name;
    c.job.name = name + "-resumed";
    const TrainResult resumed = train(c, from_step4);
    ASSERT_EQ(resumed.first_step, 5) << name;
    ASSERT_EQ(resumed.losses.size(), 4u) << name;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(resumed.losses[i], resident.losses[4 + i]) << name << " step " << 5 + i;
    }
  }
}

}  // namespace
}  // namespace moepeak
