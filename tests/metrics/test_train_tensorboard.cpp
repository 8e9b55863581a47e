// metrics.tensorboard in real training runs on one process: the events files under
// <run_dir>/tensorboard, read back by the tests' own reader (tests/metrics/event_file_reader.h),
// hold every step of metrics.jsonl once with the same values (as float32: TensorBoard's
// simple_value), the evaluation's after the steps it followed; a run resumed from an earlier
// checkpoint in the same run directory leaves each step once, with the values of the run that
// wrote it last. Off (the default), nothing is written.
// Run: ctest -R test_train_tensorboard
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/train/trainer.h"
#include "tests/metrics/event_file_reader.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::event_files_in;
using test_support::scalars_in;
using test_support::StepScalars;
using test_support::TempDir;

constexpr int64_t kB = 4, kT = 32;

// A headerless uint16 token file: random-looking ids < 32, each repeated 5 later (learnable).
std::string write_tokens(const fs::path& path, size_t n, uint32_t seed) {
  std::vector<uint16_t> t(n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = i >= 5 && i % 7 != 0 ? t[i - 5] : static_cast<uint16_t>((x >> 16) % 32);
  }
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  return path.string();
}

Config tensorboard_config(const fs::path& dir, int64_t steps, std::vector<std::string> extra) {
  std::vector<std::string> sets = {
      "job.run_dir=" + dir.string(),
      "training.steps=" + std::to_string(steps),
      "training.seq_len=" + std::to_string(kT),
      "training.batch_size=" + std::to_string(kB),
      "training.dataset=bin",
      "training.dataset_path=" + write_tokens(dir / "train.bin", 20 * kB * kT + 1, 3),
      "eval.dataset_path=" + write_tokens(dir / "heldout.bin", kB * kT + 1, 11),
      "eval.interval=2",
      "eval.batches=1",
      "model.vocab_size=32",
      "metrics.progress=off",
      "runtime.log_level=warn"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config({}, sets);
}

// step -> its last line in metrics.jsonl (a resumed run appends the steps it runs again).
std::map<int64_t, nlohmann::json> last_line_of_each_step(const std::string& path) {
  std::ifstream in(path);
  std::map<int64_t, nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j;
  }
  return out;
}

// The tags and values a step's JSON line says TensorBoard must show, read from the JSON alone.
std::map<std::string, float> expected_scalars(const nlohmann::json& j) {
  std::map<std::string, float> want = {{"train/loss", j.at("loss").get<float>()},
                                       {"train/grad_norm", j.at("grad_norm").get<float>()},
                                       {"train/lr", j.at("lr").get<float>()},
                                       {"perf/tokens_per_s", j.at("tokens_per_s").get<float>()},
                                       {"perf/tflops", j.at("tflops").get<float>()},
                                       {"perf/mfu", j.at("mfu").get<float>()}};
  for (const auto& [set, bytes] : j.at("peak_bytes").items())
    want["memory/" + set + "_peak_bytes"] = static_cast<float>(bytes.get<double>());
  if (j.contains("eval_loss")) {
    want["eval/loss"] = j.at("eval_loss").get<float>();
    want["eval/perplexity"] = j.at("eval_perplexity").get<float>();
  }
  return want;
}

void expect_events_match_jsonl(const StepScalars& events,
                               const std::map<int64_t, nlohmann::json>& lines) {
  ASSERT_EQ(events.size(), lines.size());
  for (const auto& [step, j] : lines) {
    ASSERT_TRUE(events.count(step)) << "step " << step;
    const std::map<std::string, float> want = expected_scalars(j);
    const std::map<std::string, float>& got = events.at(step);
    EXPECT_EQ(got.size(), want.size()) << "step " << step;
    for (const auto& [tag, value] : want) {
      ASSERT_TRUE(got.count(tag)) << tag << " at step " << step;
      EXPECT_EQ(got.at(tag), value) << tag << " at step " << step;
    }
  }
}

TEST(TrainTensorBoard, EventsHoldEveryStepOfMetricsJsonl) {
  TempDir dir;
  const TrainResult r = train(tensorboard_config(dir.path(), 5, {"metrics.tensorboard=true"}), {});
  ASSERT_EQ(r.losses.size(), 5u);
  EXPECT_EQ(r.tensorboard_dir, (fs::path(r.run_dir) / "tensorboard").string());
  ASSERT_EQ(event_files_in(r.tensorboard_dir).size(), 1u);
  const StepScalars events = scalars_in(r.tensorboard_dir);
  const std::map<int64_t, nlohmann::json> lines = last_line_of_each_step(r.metrics_file);
  ASSERT_EQ(lines.size(), 5u);
  expect_events_match_jsonl(events, lines);
  // The evaluations (after steps 2, 4 and 5) are there, and the loss is the run's.
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_EQ(events.at(step).count("eval/loss"), step == 2 || step == 4 || step == 5 ? 1u : 0u)
        << step;
    EXPECT_EQ(events.at(step).at("train/loss"), static_cast<float>(r.losses[step - 1]));
  }
  EXPECT_EQ(events.at(1).count("memory/logits_peak_bytes"), 1u);
  EXPECT_GT(events.at(1).at("memory/total_peak_bytes"), 0.0f);

  // Off by default: no folder.
  Config off = tensorboard_config(dir.path(), 1, {"job.name=off"});
  const TrainResult o = train(off, {});
  EXPECT_TRUE(o.tensorboard_dir.empty());
  EXPECT_FALSE(fs::exists(fs::path(o.run_dir) / "tensorboard"));
}

// Trained to step 6 with checkpoints every 2 steps, then resumed in the same run directory from
// step 4's checkpoint to step 8 (as after a crash past the last checkpoint): steps 5 and 6 are
// in the directory once, with the resumed run's values; a --resume from the latest checkpoint
// then continues to 9 dropping nothing.
TEST(TrainTensorBoard, AResumedRunLeavesEveryStepOnce) {
  TempDir dir;
  Config cfg = tensorboard_config(dir.path(), 6,
                                  {"metrics.tensorboard=true", "checkpoint.enable=true",
                                   "checkpoint.interval=2", "checkpoint.keep_latest=5"});
  const TrainResult first = train(cfg, {});
  ASSERT_EQ(first.losses.size(), 6u);

  cfg.training.steps = 8;
  TrainOptions from_4;
  from_4.resume_from = (fs::path(first.run_dir) / "checkpoints" / checkpoint_dir_name(4)).string();
  const TrainResult resumed = train(cfg, from_4);
  ASSERT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(event_files_in(resumed.tensorboard_dir).size(), 2u)
      << "the first run's (steps 1..4 left) and the resumed run's";
  std::map<int64_t, nlohmann::json> lines = last_line_of_each_step(resumed.metrics_file);
  ASSERT_EQ(lines.size(), 8u);
  expect_events_match_jsonl(scalars_in(resumed.tensorboard_dir), lines);

  cfg.training.steps = 9;
  TrainOptions latest;
  latest.resume = true;
  const TrainResult last = train(cfg, latest);
  ASSERT_EQ(last.first_step, 9);
  EXPECT_EQ(event_files_in(last.tensorboard_dir).size(), 3u);
  lines = last_line_of_each_step(last.metrics_file);
  ASSERT_EQ(lines.size(), 9u);
  expect_events_match_jsonl(scalars_in(last.tensorboard_dir), lines);
}

}  // namespace
}  // namespace moepeak
