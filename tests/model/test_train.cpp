// The training loop end to end on the CPU: the copy task is learned, runs are bitwise
// deterministic, a resumed run continues bit for bit, checkpoints and step dumps have the
// documented layout, and the metrics file has one JSON object per step. Each offload placement
// of the optimizer (offload_serial, offload_stream) trains bitwise like resident (losses, and
// the weights, m and v the final checkpoint holds) and resumes bit for bit. A stop signal
// (preemption) checkpoints at the step boundary and the resumed run ends bit for bit the same.
// Run: ctest -R test_train
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/model/mixtral_params.h"
#include "core/train/trainer.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::TempDir;

// A small, quick copy task: vocab 32, 16 sequences of 32 tokens.
Config quick_config(const fs::path& run_dir, int64_t steps) {
  return load_config({},
                     {"job.run_dir=" + run_dir.string(), "training.steps=" + std::to_string(steps),
                      "training.seq_len=32", "training.batch_size=16", "model.vocab_size=32",
                      "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
}

TEST(Train, LearnsTheCopyTask) {
  TempDir dir;
  TrainResult r = train(quick_config(dir.path(), 100), {});
  ASSERT_EQ(r.losses.size(), 100u);
  EXPECT_GT(r.losses.front(), 3.0);  // ~ln(32) = 3.47 at the start
  EXPECT_LT(r.losses.back(), 0.05) << "the copied half should be predicted almost perfectly";
  // The metrics file has one object per step with the documented names.
  std::ifstream in(r.metrics_file);
  std::string line;
  int64_t lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++lines;
    EXPECT_EQ(j["step"].get<int64_t>(), lines);
    for (const char* key :
         {"loss", "grad_norm", "lr", "tokens_per_s", "tflops", "mfu", "peak_bytes"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_GT(j["peak_bytes"]["total"].get<uint64_t>(), 0u);
    EXPECT_GT(j["peak_bytes"]["logits"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(lines, 100);
}

TEST(Train, SameSeedGivesBitwiseEqualLosses) {
  TempDir a, b;
  TrainResult ra = train(quick_config(a.path(), 6), {});
  TrainResult rb = train(quick_config(b.path(), 6), {});
  ASSERT_EQ(ra.losses.size(), 6u);
  EXPECT_EQ(ra.losses, rb.losses);  // exact
  Config other = quick_config(a.path(), 6);
  other.job.seed = 99;
  other.job.name = "other-seed";
  EXPECT_NE(train(other, {}).losses, ra.losses);
}

TEST(Train, ResumeContinuesBitForBit) {
  TempDir dir;
  Config cfg = quick_config(dir.path(), 8);
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 4;
  cfg.checkpoint.keep_latest = 5;
  TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 8u);
  const fs::path ckpt = fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(4);
  ASSERT_TRUE(fs::exists(ckpt / "model.safetensors"));
  ASSERT_TRUE(fs::exists(ckpt / "config.json"));
  ASSERT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
  {
    // Whole tensors under Hugging Face names, so the checkpoint does not depend on the rank count.
    auto state = SafetensorsFile::open((ckpt / "optimizer.safetensors").string());
    const ParamLayout layout(cfg.model);
    for (const ParamInfo& p : layout.params()) {
      std::vector<int64_t> shape;
      for (int i = 0; i < p.shape.ndim(); ++i) shape.push_back(p.shape[i]);
      EXPECT_EQ(state.info("exp_avg." + p.name).shape, shape) << p.name;
      EXPECT_EQ(state.info("exp_avg_sq." + p.name).shape, shape) << p.name;
    }
    EXPECT_EQ(state.metadata().at("world_size"), "1");
  }

  // A second run (another run directory) resumed from step 4 of the first.
  Config resumed_cfg = cfg;
  resumed_cfg.job.name = "resumed";
  TrainOptions options;
  options.resume_from = ckpt.string();
  TrainResult resumed = train(resumed_cfg, options);
  ASSERT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(resumed.losses[i], full.losses[4 + i]) << "step " << 5 + i;

  // --resume picks the latest checkpoint of the run itself; at step 8 there is nothing left to do.
  TrainOptions latest;
  latest.resume = true;
  EXPECT_TRUE(train(cfg, latest).losses.empty());
}

// Preemption (TrainOptions::stop_signal): a signal seen after a step stops the run at that step
// boundary with a checkpoint — even with checkpoint.enable = false — and --resume continues it to
// the uninterrupted run's losses, bit for bit. No signal: the run is untouched.
TEST(Train, StopSignalCheckpointsAtTheStepBoundaryAndResumes) {
  TempDir dir;
  Config cfg = quick_config(dir.path(), 6);
  cfg.checkpoint.enable = false;
  const TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 6u);

  std::atomic<int> signal{0};
  TrainOptions quiet;
  quiet.stop_signal = &signal;
  cfg.job.name = "quiet";
  const TrainResult untouched = train(cfg, quiet);
  EXPECT_EQ(untouched.stopped_by_signal, 0);
  EXPECT_EQ(untouched.losses, full.losses);
  EXPECT_FALSE(fs::exists(fs::path(untouched.run_dir) / "checkpoints"));

  cfg.job.name = "preempted";
  signal = 10;  // SIGUSR1, as if it arrived during step 1
  const TrainResult stopped = train(cfg, quiet);
  EXPECT_EQ(stopped.stopped_by_signal, 10);
  EXPECT_EQ(stopped.last_step, 1);
  ASSERT_EQ(stopped.losses.size(), 1u);
  EXPECT_EQ(stopped.losses[0], full.losses[0]);
  EXPECT_TRUE(fs::exists(fs::path(stopped.run_dir) / "checkpoints" / checkpoint_dir_name(1) /
                         "model.safetensors"));

  signal = 0;
  TrainOptions resume = quiet;
  resume.resume = true;
  const TrainResult rest = train(cfg, resume);
  EXPECT_EQ(rest.stopped_by_signal, 0);
  EXPECT_EQ(rest.first_step, 2);
  ASSERT_EQ(rest.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(rest.losses[i], full.losses[1 + i]) << "step " << 2 + i;

  // A signal after the last step changes nothing: the run is complete.
  cfg.job.name = "late";
  cfg.training.steps = 1;
  signal = 15;
  const TrainResult late = train(cfg, quiet);
  EXPECT_EQ(late.stopped_by_signal, 0);
  EXPECT_EQ(late.losses.size(), 1u);
}

TEST(Train, ResumeRejectsACheckpointOfAnotherModel) {
  TempDir dir;
  Config cfg = quick_config(dir.path(), 2);
  cfg.checkpoint.enable = true;
  TrainResult r = train(cfg, {});
  Config wider = cfg;
  wider.model.hidden_size = 32;
  wider.model.head_dim = 8;
  wider.job.name = "wider";
  TrainOptions options;
  options.resume_from = (fs::path(r.run_dir) / "checkpoints" / checkpoint_dir_name(2)).string();
  EXPECT_THROW(train(wider, options), Error);
}

TEST(Train, StepDumpHasWeightsBatchLossAndGrads) {
  TempDir dir;
  TrainOptions options;
  options.dump_step_dir = (dir.path() / "dump").string();
  Config cfg = quick_config(dir.path(), 1);
  TrainResult r = train(cfg, options);
  const fs::path d = dir.path() / "dump";
  auto model = SafetensorsFile::open((d / "model.safetensors").string());
  auto grads = SafetensorsFile::open((d / "grads.safetensors").string());
  auto batch = SafetensorsFile::open((d / "batch.safetensors").string());
  ParamLayout layout(cfg.model);
  ASSERT_EQ(model.names().size(), layout.params().size());
  for (const ParamInfo& p : layout.params()) {
    EXPECT_TRUE(model.contains(p.name)) << p.name;
    EXPECT_TRUE(grads.contains(p.name)) << p.name;
    EXPECT_EQ(grads.info(p.name).dtype, "F32");
  }
  EXPECT_EQ(batch.info("input_ids").dtype, "I64");
  EXPECT_EQ(batch.info("labels").shape, (std::vector<int64_t>{16, 32}));
  std::ifstream loss_in(d / "loss.json");
  auto loss = nlohmann::json::parse(loss_in);
  EXPECT_EQ(loss["loss"].get<double>(), r.losses.front());
  std::ifstream config_in(d / "config.json");
  auto config = nlohmann::json::parse(config_in);
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], cfg.model.num_local_experts);
}

// ---- optimizer.placement: the offload placements against resident --------------------------

Config placement_config(const fs::path& run_dir, int64_t steps, OptimizerPlacement placement) {
  Config cfg = quick_config(run_dir, steps);
  cfg.optimizer.placement = placement;
  cfg.job.name = std::string(enum_name(placement));
  // Buckets that split parameters and two slots, so slots are reused within a step.
  cfg.optimizer.bucket_params = 5000;
  cfg.optimizer.staging_slots = 2;
  return cfg;
}

// Every tensor of a safetensors file, by name.
std::map<std::string, std::vector<char>> read_all(const fs::path& path) {
  auto file = SafetensorsFile::open(path.string());
  std::map<std::string, std::vector<char>> out;
  for (const std::string& name : file.names()) {
    std::vector<char> bytes(file.info(name).bytes);
    file.read(name, bytes.data(), bytes.size());
    out[name] = std::move(bytes);
  }
  return out;
}

class TrainPlacement : public ::testing::TestWithParam<OptimizerPlacement> {};

TEST_P(TrainPlacement, LossesWeightsAndMomentsAreBitwiseResident) {
  TempDir dir;
  Config resident_cfg = placement_config(dir.path(), 8, OptimizerPlacement::resident);
  resident_cfg.checkpoint.enable = true;
  Config cfg = placement_config(dir.path(), 8, GetParam());
  cfg.checkpoint.enable = true;
  const TrainResult resident = train(resident_cfg, {});
  const TrainResult r = train(cfg, {});
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_EQ(r.losses, resident.losses);  // exact
  const fs::path a = fs::path(resident.run_dir) / "checkpoints" / checkpoint_dir_name(8);
  const fs::path b = fs::path(r.run_dir) / "checkpoints" / checkpoint_dir_name(8);
  EXPECT_TRUE(read_all(a / "model.safetensors") == read_all(b / "model.safetensors"))
      << "weights differ";
  EXPECT_TRUE(read_all(a / "optimizer.safetensors") == read_all(b / "optimizer.safetensors"))
      << "m or v differ";
  EXPECT_EQ(SafetensorsFile::open((b / "optimizer.safetensors").string())
                .metadata()
                .at("optimizer_placement"),
            enum_name(GetParam()));
}

TEST_P(TrainPlacement, ResumeContinuesBitForBit) {
  TempDir dir;
  Config cfg = placement_config(dir.path(), 8, GetParam());
  cfg.checkpoint.enable = true;
  cfg.checkpoint.interval = 4;
  cfg.checkpoint.keep_latest = 5;
  TrainResult full = train(cfg, {});
  ASSERT_EQ(full.losses.size(), 8u);
  const fs::path ckpt = fs::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(4);
  Config resumed_cfg = cfg;
  resumed_cfg.job.name = "resumed";
  TrainOptions options;
  options.resume_from = ckpt.string();
  TrainResult resumed = train(resumed_cfg, options);
  ASSERT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(resumed.losses[i], full.losses[4 + i]) << "step " << 5 + i;
  // A checkpoint is placement-independent: resident resumes this one bit for bit too.
  Config other = resumed_cfg;
  other.job.name = "resumed-resident";
  other.optimizer.placement = OptimizerPlacement::resident;
  TrainResult as_resident = train(other, options);
  EXPECT_EQ(as_resident.losses, resumed.losses);
}

INSTANTIATE_TEST_SUITE_P(Offload, TrainPlacement,
                         ::testing::Values(OptimizerPlacement::offload_serial,
                                           OptimizerPlacement::offload_stream),
                         [](const ::testing::TestParamInfo<OptimizerPlacement>& info) {
                           return std::string(enum_name(info.param));
                         });

}  // namespace
}  // namespace moepeak
