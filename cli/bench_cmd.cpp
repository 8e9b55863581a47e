// `moepeak bench step`: whole training steps — tokens/s and achieved GFLOP/s (model FLOPs,
// flops.h) beside a single-GEMM ceiling measured in the same run on the same machine; on W ranks
// under mpirun the ceiling is summed over the ranks, measured while all run at once.
//
//   moepeak bench step [--config F]... [--set k=v]... [--warmup 2] [--iters 5] [--gemm-size n]
//                      [--json FILE]
//
// The `bench` command itself is registered here; each bench is a file cli/bench_<name>.cpp
// (bench_common.h has the shared flags, table and JSON helpers).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/train/trainer.h"
#include "core/units.h"

namespace moepeak::cli {
namespace {

struct StepBenchArgs {
  BenchCommonArgs common;
  int gemm_size = 1024;
};

int run_bench_step(const StepBenchArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  cfg.metrics.progress = ProgressMode::off;
  // NOTES: the LR schedule must not reach its end inside the timed steps, or the run would time a
  // different optimiser regime than training does; steps only sets the schedule's length here.
  cfg.training.steps =
      std::max<int64_t>(cfg.training.steps, args.common.warmup + args.common.iters);
  Trainer trainer(cfg, TrainOptions{});
  const int W = trainer.world_size();
  const bool root = trainer.rank() == 0;  // rank 0 prints and writes the JSON
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  // NOTES: the ceiling is measured before and after the timed steps and the higher value kept,
  // so a machine that was busy during one measurement does not flatter the ratio. With W ranks
  // every rank measures at once (sharing the host as the steps do) and the job's ceiling is the
  // sum.
  double ceiling = trainer.sum_over_ranks(trainer.measure_gemm_ceiling(args.gemm_size, 5));

  if (root) {
    std::printf("# moepeak bench step: %s\n", trainer.describe().c_str());
    std::printf("# host %s, %s; batch %lld x seq %lld = %lld tokens/step, world %d\n",
                process_host().c_str(), now_utc().c_str(), static_cast<long long>(B),
                static_cast<long long>(T), static_cast<long long>(B * T), W);
    std::printf(
        "# model FLOPs per step %.4g; GEMM ceiling (f32 %d^3, best of 5, summed over ranks) "
        "%.2f GFLOP/s\n",
        trainer.flops_per_step(), args.gemm_size, ceiling);
    std::printf("# %5s %10s %12s %10s %10s %12s %10s\n", "iter", "time_s", "tokens/s", "GFLOP/s",
                "%ceiling", "peak", "loss");
  }
  std::vector<double> times;
  StepMetrics last;
  for (int i = 0; i < args.common.warmup + args.common.iters; ++i) {
    StepMetrics m = trainer.step();
    bool timed = i >= args.common.warmup;
    if (timed) times.push_back(m.step_time_s);
    double gflops = trainer.flops_per_step() / m.step_time_s / 1e9;
    if (root) {
      std::printf("  %5s %10.4f %12.0f %10.2f %9.1f%% %12s %10.4f\n",
                  timed ? std::to_string(i - args.common.warmup + 1).c_str() : "warm",
                  m.step_time_s, m.tokens_per_s, gflops, 100.0 * gflops / ceiling,
                  format_bytes(m.max_rank_peak()).c_str(), m.loss);
    }
    last = m;
  }
  ceiling =
      std::max(ceiling, trainer.sum_over_ranks(trainer.measure_gemm_ceiling(args.gemm_size, 5)));
  const double t = median(times);
  const double tokens_per_s = static_cast<double>(B * T) / t;
  const double gflops = trainer.flops_per_step() / t / 1e9;
  if (!root) return 0;
  std::printf("# GEMM ceiling measured again after the steps: max %.2f GFLOP/s\n", ceiling);
  std::printf(
      "# median over %d steps: %.4f s, %.0f tokens/s, %.2f GFLOP/s = %.1f%% of the GEMM ceiling; "
      "peak %s on the fullest rank\n",
      args.common.iters, t, tokens_per_s, gflops, 100.0 * gflops / ceiling,
      format_bytes(last.max_rank_peak()).c_str());

  if (!args.common.json_path.empty()) {
    nlohmann::json peak = {{"total", last.max_rank_peak()}};  // the fullest rank's
    for (LiveSet s : kAllLiveSets) peak[std::string(live_set_name(s))] = last.peak_per_set[s];
    peak["rank_totals"] = last.rank_peak_bytes;
    nlohmann::json row = {{"schedule", "standard"},
                          {"time_s", t},
                          {"step_s", t},
                          {"peak_bytes", peak},
                          {"bound_bytes", nullptr},
                          {"max_rel_err", 0.0},
                          {"tokens_per_s", tokens_per_s},
                          {"gflops", gflops}};
    nlohmann::json shape = {{"batch", B},
                            {"seq_len", T},
                            {"hidden_size", cfg.model.hidden_size},
                            {"num_hidden_layers", cfg.model.num_hidden_layers},
                            {"num_local_experts", cfg.model.num_local_experts},
                            {"num_experts_per_tok", cfg.model.num_experts_per_tok},
                            {"vocab_size", cfg.model.vocab_size}};
    write_bench_json(args.common.json_path, "step", W, shape, nlohmann::json::array({row}));
  }
  return 0;
}

}  // namespace

void register_bench_step(CLI::App& bench, Context& ctx) {
  static StepBenchArgs args;
  auto* step = bench.add_subcommand("step", "time whole training steps against a GEMM ceiling");
  add_bench_common_options(*step, args.common);
  step->add_option("--gemm-size", args.gemm_size, "n of the n^3 GEMM that sets the ceiling")
      ->check(CLI::Range(64, 8192));
  step->callback([&ctx] {
    ctx.action = [&ctx] {
      join_ranks();
      int rc = run_bench_step(args, ctx);
      finalize_process_group();
      return rc;
    };
  });
}

void register_bench_command(CLI::App& app, Context& ctx) {
  auto* bench =
      app.add_subcommand("bench", "benchmarks: reference vs bounded schedules, whole steps");
  bench->require_subcommand(1);
  register_bench_step(*bench, ctx);
  register_bench_sco(*bench, ctx);
  register_bench_vocab(*bench, ctx);
  register_bench_adamw(*bench, ctx);
  register_bench_dispatch(*bench, ctx);
  register_bench_overlap(*bench, ctx);
  register_bench_gemm(*bench, ctx);
  register_bench_attention(*bench, ctx);
  register_bench_checkpoint(*bench, ctx);
  register_bench_data(*bench, ctx);
  register_bench_reach(*bench, ctx);
}

}  // namespace moepeak::cli
