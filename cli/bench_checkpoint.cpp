// `moepeak bench checkpoint`: what a checkpoint costs the training loop — no save, a synchronous
// save (core/checkpoint/sharded_checkpoint.h: the step boundary streams every shard to disk) and
// an asynchronous one (checkpoint.async, core/checkpoint/async_checkpoint.h: the step boundary
// copies the state to a pinned snapshot, a background thread writes it).
//
//   moepeak bench checkpoint [--config F]... [--set k=v]... [--warmup 1] [--iters 5]
//                            [--every 1] [--keep] [--json FILE]
//
// Each mode is one Trainer built from the same config and seed, run one after the other for
// warmup + iters steps, saving after every `--every`-th step into its own run directory
// (job.run_dir/bench-checkpoint-<mode>, removed afterwards unless --keep). Per mode the table
// gives the medians over the timed steps of the step itself, of the save call at a saving step
// (for async: the snapshot, plus the wait for the previous save still being written), of the
// per-step poll, and the loop time per step (step + save + poll, summed over the timed steps and
// divided by their count); `vs none` is that loop time over no-save's. `drain_s` is the wait for
// the last asynchronous write at the end. The last saves of sync and async must be byte-identical
// shard files (the same state written two ways); the bench fails otherwise. On W ranks under
// mpirun every figure is the slowest rank's. docs/perf.md has the command and results.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/checkpoint/train_checkpoint.h"  // defines: checkpoint_dir_name
#include "core/comm/process_group.h"           // defines: finalize_process_group
#include "core/config/config.h"
#include "core/error.h"
#include "core/train/trainer.h"
#include "core/units.h"

namespace moepeak::cli {
namespace {

namespace fs = std::filesystem;

struct CheckpointBenchArgs {
  BenchCommonArgs common;
  int every = 1;
  bool keep = false;
};

enum class SaveMode { none, sync, async };
const char* mode_name(SaveMode m) {
  return m == SaveMode::none ? "none" : m == SaveMode::sync ? "sync" : "async";
}

struct ModeResult {
  SaveMode mode = SaveMode::none;
  std::vector<double> step_s, save_s, poll_s;  // save_s: saving steps only
  double loop_s = 0;                           // summed over the timed steps
  double drain_s = 0;
  uint64_t bytes_written = 0;  // the last checkpoint's files, all ranks
  std::string last_dir;        // that checkpoint's directory ("" for none)
  int rank = 0, world_size = 1;
  std::string describe;
};

using Clock = std::chrono::steady_clock;
uint64_t directory_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) bytes += e.file_size();
  return bytes;
}

std::string file_contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MOEPEAK_CHECK(in, "bench checkpoint: cannot read ", p.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ModeResult run_mode(const Config& base, SaveMode mode, const CheckpointBenchArgs& args) {
  Config cfg = base;
  cfg.metrics.progress = ProgressMode::off;
  cfg.training.steps =
      std::max<int64_t>(cfg.training.steps, args.common.warmup + args.common.iters);
  cfg.job.name = std::string("bench-checkpoint-") + mode_name(mode);
  cfg.checkpoint.enable = mode != SaveMode::none;
  cfg.checkpoint.async = mode == SaveMode::async;
  cfg.checkpoint.keep_latest = 1;  // the bench's disk use stays one checkpoint (two while saving)
  const fs::path run_dir = cfg.job.run_path();

  ModeResult r;
  r.mode = mode;
  {
    Trainer trainer(cfg, TrainOptions{});
    const bool root = trainer.rank() == 0;
    r.rank = trainer.rank();
    r.world_size = trainer.world_size();
    r.describe = trainer.describe();
    if (root && cfg.checkpoint.enable) fs::remove_all(run_dir);  // a previous bench's leftovers
    for (int i = 0; i < args.common.warmup + args.common.iters; ++i) {
      const bool timed = i >= args.common.warmup;
      const bool saving = mode != SaveMode::none && (i + 1) % args.every == 0;
      const auto t0 = Clock::now();
      trainer.step();
      const double step_s = trainer.max_over_ranks(seconds_since(t0));
      const auto t1 = Clock::now();
      if (saving) trainer.save_checkpoint();
      const double save_s = trainer.max_over_ranks(seconds_since(t1));
      const auto t2 = Clock::now();
      trainer.poll_checkpoint();
      const double poll_s = trainer.max_over_ranks(seconds_since(t2));
      if (!timed) continue;
      r.step_s.push_back(step_s);
      if (saving) r.save_s.push_back(save_s);
      r.poll_s.push_back(poll_s);
      r.loop_s += step_s + save_s + poll_s;
    }
    const auto t3 = Clock::now();
    trainer.finish_checkpoint();
    r.drain_s = trainer.max_over_ranks(seconds_since(t3));
    if (root && cfg.checkpoint.enable) {
      const fs::path folder = run_dir / cfg.checkpoint.folder;
      const fs::path last = folder / checkpoint_dir_name(trainer.completed_steps() -
                                                         trainer.completed_steps() % args.every);
      MOEPEAK_CHECK(fs::is_directory(last), "bench checkpoint: no checkpoint at ", last.string());
      r.last_dir = last.string();
      r.bytes_written = directory_bytes(last);
    }
  }
  return r;
}

int run_bench_checkpoint(const CheckpointBenchArgs& args, const Context& ctx) {
  MOEPEAK_CHECK_INPUT(args.every >= 1, "bench checkpoint: --every must be at least 1");
  MOEPEAK_CHECK_INPUT(args.common.iters >= args.every,
                      "bench checkpoint: --iters must be at least --every, so a timed step saves");
  const Config cfg = load_config_for_command(args.common.config, ctx);
  std::vector<ModeResult> results;
  for (SaveMode mode : {SaveMode::none, SaveMode::sync, SaveMode::async})
    results.push_back(run_mode(cfg, mode, args));

  // Rank 0 prints, compares the files and cleans up; the other ranks are done.
  if (results.front().rank != 0) return 0;
  const int W = results.front().world_size;
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  std::printf("# moepeak bench checkpoint: %s\n", results.front().describe.c_str());
  std::printf(
      "# host %s, %s; batch %lld x seq %lld, world %d; a save after every %d step(s); medians of "
      "%d timed steps after %d warm-up; slowest rank\n",
      process_host().c_str(), now_utc().c_str(), static_cast<long long>(B),
      static_cast<long long>(T), W, args.every, args.common.iters, args.common.warmup);
  std::printf("# %-6s %9s %9s %9s %11s %8s %9s %12s\n", "mode", "step_s", "save_s", "poll_s",
              "loop_s/step", "vs none", "drain_s", "bytes/save");
  const double none_loop = results.front().loop_s;
  nlohmann::json rows = nlohmann::json::array();
  for (const ModeResult& r : results) {
    const double loop = r.loop_s / args.common.iters;
    const double save = r.save_s.empty() ? 0.0 : median(r.save_s);
    std::printf("  %-6s %9.4f %9.4f %9.4f %11.4f %7.3fx %9.4f %12s\n", mode_name(r.mode),
                median(r.step_s), save, median(r.poll_s), loop, r.loop_s / none_loop, r.drain_s,
                r.mode == SaveMode::none ? "-" : format_bytes(r.bytes_written).c_str());
    rows.push_back({{"schedule", mode_name(r.mode)},
                    {"time_s", loop},
                    {"step_s", median(r.step_s)},
                    {"save_s", save},
                    {"poll_s", median(r.poll_s)},
                    {"drain_s", r.drain_s},
                    {"vs_none", r.loop_s / none_loop},
                    {"bytes_per_save", r.bytes_written}});
  }

  // The same state saved two ways: every shard file byte for byte.
  const fs::path sync_dir = results[1].last_dir, async_dir = results[2].last_dir;
  int compared = 0;
  for (const auto& e : fs::directory_iterator(sync_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("shard-", 0) != 0) continue;
    MOEPEAK_CHECK(file_contents(e.path()) == file_contents(async_dir / name),
                  "bench checkpoint: ", name, " differs between the sync and async saves");
    ++compared;
  }
  MOEPEAK_CHECK(compared == W, "bench checkpoint: ", compared, " shard files in ",
                sync_dir.string(), ", expected ", W);
  std::printf("# the last sync and async saves: %d shard file(s), byte-identical\n", compared);

  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"batch", B},
                            {"seq_len", T},
                            {"hidden_size", cfg.model.hidden_size},
                            {"num_hidden_layers", cfg.model.num_hidden_layers},
                            {"num_local_experts", cfg.model.num_local_experts},
                            {"vocab_size", cfg.model.vocab_size},
                            {"every", args.every}};
    write_bench_json(args.common.json_path, "checkpoint", W, shape, rows);
  }
  if (!args.keep) {
    for (SaveMode mode : {SaveMode::sync, SaveMode::async}) {
      Config c = cfg;
      c.job.name = std::string("bench-checkpoint-") + mode_name(mode);
      fs::remove_all(c.job.run_path());
    }
  }
  return 0;
}

}  // namespace

void register_bench_checkpoint(CLI::App& bench, Context& ctx) {
  static CheckpointBenchArgs args;
  args.common.warmup = 1;
  args.common.iters = 5;
  auto* sub = bench.add_subcommand(
      "checkpoint", "what a save costs the training loop: none vs synchronous vs asynchronous");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--every", args.every, "save after every N-th step")->capture_default_str();
  sub->add_flag("--keep", args.keep, "keep the checkpoints the bench wrote");
  sub->callback([&ctx] {
    ctx.action = [&ctx] {
      join_ranks();
      int rc = run_bench_checkpoint(args, ctx);
      finalize_process_group();
      return rc;
    };
  });
}

}  // namespace moepeak::cli
