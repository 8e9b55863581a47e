// The training loop end to end on the CPU: the copy task is learned, runs are bitwise
// deterministic, a resumed run continues bit for bit, checkpoints and step dumps have the
// documented layout, and the metrics file has one JSON object per step. Each offload placement
// of the optimizer (offload_serial, offload_stream) trains bitwise like resident (losses, and
// the weights, m and v the final checkpoint holds) and resumes bit for bit. A stop signal
// (preemption) checkpoints at the step boundary and the resumed run ends bit for bit the same. A
// token id past the vocabulary stops the run at the step whose window holds it.
// Run: ctest -R test_train
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/model/checkpoint_snapshot.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/train/trainer.h"
#include "tests/temp_dir.h"
#include "tests/train_checks.h"

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
  ASSERT_TRUE(fs::exists(ckpt / "manifest.json"));
  ASSERT_TRUE(fs::exists(ckpt / "config.json"));
  ASSERT_TRUE(fs::exists(ckpt / "shard-00000.bin"));
  EXPECT_FALSE(fs::exists(ckpt / "shard-00000.json")) << "the sidecar stays out of the checkpoint";
  {
    // Every tensor under its Hugging Face name (the optimizer's prefixed), whole shapes.
    ShardedCheckpoint state(ckpt.string());
    const ParamLayout layout(cfg.model);
    for (const ParamInfo& p : layout.params()) {
      const std::vector<int64_t> shape = p.shape.dims();
      EXPECT_EQ(state.manifest().tensor(p.name, "test").shape, shape) << p.name;
      EXPECT_EQ(state.manifest().tensor("exp_avg." + p.name, "test").shape, shape) << p.name;
      EXPECT_EQ(state.manifest().tensor("exp_avg_sq." + p.name, "test").shape, shape) << p.name;
    }
    EXPECT_EQ(state.metadata().at("world_size"), 1);
    EXPECT_EQ(state.metadata().at("step"), 4);
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

// A token file's ids are checked as their windows are read (no scan at open): a run over a file
// with one id past the vocabulary trains the steps before it and stops with an error naming the
// file, the token's offset and its value at the step whose window holds it.
TEST(Train, ABadTokenIdStopsTheRunAtTheStepThatReadsIt) {
  TempDir dir;
  // 16 sequences of 32 tokens = 512 tokens a step; the bad id in step 3's tokens.
  std::vector<uint16_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 32);
  tokens[2 * 512 + 100] = 40;
  const fs::path file = dir.path() / "train.bin";
  {
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  }
  Config cfg = quick_config(dir.path(), 5);
  cfg.training.dataset = DatasetKind::bin;
  cfg.training.dataset_path = file.string();
  cfg.training.token_dtype = TokenDtype::uint16;
  cfg.training.shuffle = false;  // step 3 reads tokens [1024, 1536)
  std::string error;
  try {
    train(cfg, {});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find(file.string() + ": token 40 at offset 1124 (byte 2248) is >= "
                                       "model.vocab_size 32"),
            std::string::npos)
      << error;
  // Steps 1 and 2 ran (and were logged) before step 3 read the window.
  EXPECT_EQ(test_support::metrics_line_count(dir.path() / "moepeak" / "metrics.jsonl"), 2);
}

// The write buffer (checkpoint.write_buffer) bounds a save's host memory and changes no byte:
// a save through 4 KiB (every piece in many pieces) writes the files a 64 MiB one writes.
TEST(Train, TheWriteBufferChangesNoByteOfTheCheckpoint) {
  TempDir dir;
  Config big = quick_config(dir.path(), 2);
  big.checkpoint.enable = true;
  big.job.name = "big-buffer";
  Config small = big;
  small.job.name = "small-buffer";
  small.checkpoint.write_buffer = "4KiB";
  EXPECT_EQ(small.checkpoint.write_buffer_bytes(), 4096u);
  const TrainResult a = train(big, {}), b = train(small, {});
  const fs::path ca = fs::path(a.run_dir) / "checkpoints" / checkpoint_dir_name(2);
  const fs::path cb = fs::path(b.run_dir) / "checkpoints" / checkpoint_dir_name(2);
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_GT(fs::file_size(ca / "shard-00000.bin"), 100u * 4096) << "the test needs many buffers";
  EXPECT_TRUE(bytes(ca / "shard-00000.bin") == bytes(cb / "shard-00000.bin"));
  EXPECT_TRUE(bytes(ca / "manifest.json") == bytes(cb / "manifest.json"));
}

// checkpoint.async: the step boundary snapshots the state and a thread writes it while the next
// steps run. The checkpoints are byte for byte the synchronous ones (the snapshot is the state at
// its boundary, whatever the steps after it change), training is unchanged, and a resume from
// an asynchronous checkpoint continues bit for bit; the end of training waits for the last save.
TEST(Train, AsyncSavesWriteTheSynchronousBytesAndResumeBitForBit) {
  TempDir dir;
  Config sync = quick_config(dir.path(), 6);
  sync.checkpoint.enable = true;
  sync.checkpoint.interval = 2;
  sync.checkpoint.keep_latest = 5;
  sync.job.name = "sync";
  Config async = sync;
  async.checkpoint.async = true;
  async.job.name = "async";
  const TrainResult a = train(sync, {}), b = train(async, {});
  EXPECT_EQ(a.losses, b.losses) << "saving in the background changes no step";
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  for (int64_t step : {2, 4, 6}) {
    const fs::path ca = fs::path(a.run_dir) / "checkpoints" / checkpoint_dir_name(step);
    const fs::path cb = fs::path(b.run_dir) / "checkpoints" / checkpoint_dir_name(step);
    ASSERT_TRUE(fs::exists(cb / "manifest.json")) << "step " << step << " was committed";
    EXPECT_TRUE(bytes(ca / "shard-00000.bin") == bytes(cb / "shard-00000.bin")) << step;
    EXPECT_TRUE(bytes(ca / "manifest.json") == bytes(cb / "manifest.json")) << step;
  }
  std::ifstream latest(fs::path(b.run_dir) / "checkpoints" / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, checkpoint_dir_name(6)) << "the end of training waited for the last save";
  // Three saves share the one snapshot reserved at setup: the pinned pool's optimizer set (the
  // optimizer state itself is on the device) peaks at one snapshot, the planner's term.
  const int64_t P = zero_persistent_elements(async.model, 1);
  EXPECT_EQ(b.last.host_peak_per_set[LiveSet::optimizer],
            checkpoint_snapshot_bytes(P, checkpoint_flat_dtypes(DType::f32)));
  EXPECT_EQ(a.last.host_peak_per_set[LiveSet::optimizer], 0u) << "a synchronous save pins nothing";

  Config resumed = async;
  resumed.job.name = "async-resumed";
  TrainOptions options;
  options.resume_from = (fs::path(b.run_dir) / "checkpoints" / checkpoint_dir_name(4)).string();
  const TrainResult r = train(resumed, options);
  ASSERT_EQ(r.losses.size(), 2u);
  EXPECT_EQ(r.losses[0], a.losses[4]);
  EXPECT_EQ(r.losses[1], a.losses[5]);

  // A stop signal at step 3: step 2's save may still be writing; the stop waits for it, saves
  // step 3 and waits for that too before train() returns.
  Config stopped = async;
  stopped.job.name = "async-stopped";
  stopped.checkpoint.interval = 2;
  std::atomic<int> signal{10};
  TrainOptions stop;
  stop.stop_signal = &signal;
  stop.resume_from = (fs::path(b.run_dir) / "checkpoints" / checkpoint_dir_name(2)).string();
  const TrainResult st = train(stopped, stop);
  EXPECT_EQ(st.stopped_by_signal, 10);
  EXPECT_EQ(st.last_step, 3);
  EXPECT_TRUE(
      fs::exists(fs::path(st.run_dir) / "checkpoints" / checkpoint_dir_name(3) / "manifest.json"));
  TrainOptions after;
  after.resume = true;
  stopped.training.steps = 4;
  const TrainResult cont = train(stopped, after);
  ASSERT_EQ(cont.losses.size(), 1u);
  EXPECT_EQ(cont.losses[0], a.losses[3]) << "step 4 from the stop's checkpoint, bit for bit";
}

// This process's resident memory ("VmRSS") or its peak since the last reset ("VmHWM"), bytes.
uint64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "no " << key << " in /proc/self/status";
  return 0;
}

// The host peak of a save (docs/design.md, Checkpoints): the rank's pieces stream from (device)
// memory through the write buffer, so the process grows by that buffer, not by its state. The
// state here is ~80 MiB (weights, m, v) against a 1 MiB buffer; the bound allows 3 MiB more for
// the manifest, sidecar and JSON strings. (On the CPU backend device memory is host memory, all
// of it resident after a step: only what the save allocates can move the peak.)
TEST(Train, ASaveGrowsTheHostPeakByItsWriteBufferNotByTheState) {
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS (Linux >= 4.0)
  if (proc_status_bytes("VmHWM") > proc_status_bytes("VmRSS") + (1u << 20)) {
    GTEST_SKIP() << "this kernel cannot reset the peak RSS (/proc/self/clear_refs)";
  }
  TempDir dir;
  Config cfg = load_config(
      {}, {"job.run_dir=" + dir.path().string(), "training.steps=1", "training.seq_len=16",
           "training.batch_size=2", "model.vocab_size=4096", "model.hidden_size=256",
           "model.head_dim=64", "model.intermediate_size=512", "metrics.progress=\"off\"",
           "runtime.log_level=\"warn\"", "checkpoint.write_buffer=\"1MiB\""});
  Trainer trainer(cfg, {});
  trainer.step();
  trainer.save_checkpoint();  // the first save pages in its code and makes the folder
  const fs::path shard = fs::path(cfg.job.run_path()) / cfg.checkpoint.folder /
                         checkpoint_dir_name(1) / "shard-00000.bin";
  const uint64_t state = fs::file_size(shard);
  ASSERT_GT(state, 64ull << 20) << "the state must dwarf the buffer for the bound to mean much";

  malloc_trim(0);  // hand back what the first save freed, so the second one allocates anew
  std::ofstream("/proc/self/clear_refs") << "5";
  const uint64_t before = proc_status_bytes("VmRSS");
  trainer.save_checkpoint();
  const uint64_t growth = proc_status_bytes("VmHWM") - before;
  EXPECT_LE(growth, cfg.checkpoint.write_buffer_bytes() + (3ull << 20))
      << "a save of " << state << " bytes of state grew the host peak by " << growth;
  std::printf("# save of %llu bytes of state: host peak +%llu bytes (write buffer %llu)\n",
              static_cast<unsigned long long>(state), static_cast<unsigned long long>(growth),
              static_cast<unsigned long long>(cfg.checkpoint.write_buffer_bytes()));
}

// A byte flipped in a shard file (not a NaN: one bit of one float) fails the resume naming the
// file, the block and the tensor whose bytes changed; nothing is trained from the corrupt state.
TEST(Train, ResumeFromACorruptShardFailsNamingFileAndTensor) {
  TempDir dir;
  Config cfg = quick_config(dir.path(), 2);
  cfg.checkpoint.enable = true;
  const TrainResult r = train(cfg, {});
  const fs::path ckpt = fs::path(r.run_dir) / "checkpoints" / checkpoint_dir_name(2);
  ShardedCheckpoint c(ckpt.string());
  const ShardTensor& t = c.manifest().tensor("model.norm.weight", "test");
  const uint64_t at = t.slices.at(0).offset + 5;  // inside its first float
  {
    std::fstream f(ckpt / "shard-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x01);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&byte, 1);
  }
  Config again = cfg;
  again.job.name = "from-corrupt";
  TrainOptions options;
  options.resume_from = ckpt.string();
  try {
    train(again, options);
    ADD_FAILURE() << "a corrupt checkpoint was loaded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("shard-00000.bin"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("fail their checksum"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("tensor 'model.norm.weight'"), std::string::npos) << e.message();
  }
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
                         "manifest.json"));

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
  ShardedCheckpoint ca(a.string()), cb(b.string());
  ASSERT_EQ(ca.manifest().tensors.size(), cb.manifest().tensors.size());
  for (const ShardTensor& t : ca.manifest().tensors) {
    EXPECT_TRUE(ca.read(t.name) == cb.read(t.name)) << t.name << " differs";  // weights, m, v
  }
  EXPECT_EQ(cb.metadata().at("optimizer_placement"), enum_name(GetParam()));
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
