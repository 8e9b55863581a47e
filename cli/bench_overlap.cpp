// `moepeak bench overlap`: does a training step hide its communication? Whole steps of the
// configured job, timed two ways on the same Trainer, step by step in turn:
//   overlap  the schedules as they run in training (comm streams beside the compute stream);
//   serial   the same schedule with every wait made blocking: serial streams
//            (core/runtime/stream_profile.h), the host waiting for each task it enqueues, so
//            no two tasks of a rank ever run at once.
// Every stream task is recorded (StreamProfile). Alone: compute = the time covered by the
// serial steps' non-communication tasks; communication = what the link model charges the step's
// operations (one link, so they add; waiting for a slower rank is not communication). The
// overlap steps are held to max(compute, communication) and the serial ones to the sum. Per
// traffic class (ZeRO gathers, ZeRO reduce-scatters, expert dispatch, vocabulary projection,
// Ulysses all-to-alls, other): the time its operations ran in the overlap steps and the part
// of it exposed, when no compute task of the rank ran. Ranks are averaged, step times are the
// slowest rank's; medians over the iterations.
//
// On the CPU backend every comm stream moves bytes through shared memory, so the link model
// (runtime.cpu_link_gb_per_s, runtime.cpu_link_latency_us) is what makes communication cost
// what it would on a network; the header prints the ratio of GEMM FLOP/s to link bytes/s it
// sets (an H200 at ~40% MFU over NVLink: ~1,000 FLOP/B; over 400 Gb/s InfiniBand: ~8,000).
//
//   mpirun -np 4 moepeak bench overlap --config F [--set k=v]... [--warmup 2] [--iters 3]
//                                      [--json FILE]
//
// Results: docs/perf.md#hidden-communication.
#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/runtime/stream_profile.h"  // defines: StreamProfile, set_serial_streams
#include "core/train/trainer.h"

namespace moepeak::cli {
namespace {

struct OverlapArgs {
  BenchCommonArgs common;
};

// The traffic classes reported (StreamTrafficTag values), then everything else.
constexpr std::array<const char*, 5> kClasses = {"zero gather", "zero reduce-scatter", "dispatch",
                                                 "vocab", "ulysses"};
constexpr size_t kOther = kClasses.size();
constexpr size_t kRows = kClasses.size() + 1;

size_t class_of(const StreamSpan& s) {
  for (size_t c = 0; c < kClasses.size(); ++c) {
    if (s.traffic == kClasses[c]) return c;
  }
  return kOther;
}

// One rank's view of one step.
struct StepView {
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_comm_s = 0, link_s = 0;
  std::array<double, kRows> class_s{}, exposed_s{};
};

StepView analyse(double step_s, const std::vector<StreamSpan>& spans) {
  std::vector<Interval> compute, comm;
  std::array<std::vector<Interval>, kRows> by_class;
  StepView v;
  for (const StreamSpan& s : spans) {
    const Interval i{s.begin_s, s.end_s};
    if (s.is_comm()) {
      comm.push_back(i);
      v.link_s += s.link_s;
      by_class[class_of(s)].push_back(i);
    } else {
      compute.push_back(i);
    }
  }
  v.step_s = step_s;
  v.compute_s = covered_seconds(compute);
  v.comm_s = covered_seconds(comm);
  v.exposed_comm_s = uncovered_seconds(comm, compute);
  for (size_t c = 0; c < kRows; ++c) {
    v.class_s[c] = covered_seconds(by_class[c]);
    v.exposed_s[c] = uncovered_seconds(by_class[c], compute);
  }
  return v;
}

// One step in a mode, recorded and analysed on this rank.
StepView timed_step(Trainer& trainer, bool serial) {
  set_serial_streams(serial);
  StreamProfile::start();
  const StepMetrics m = trainer.step();
  std::vector<StreamSpan> spans = StreamProfile::stop();
  set_serial_streams(false);
  MOEPEAK_CHECK(!spans.empty(),
                "bench overlap: no stream task was recorded; it measures the CPU backend's "
                "streams (runtime.backend = \"cpu\"), a GPU's timeline is a profiler's job");

  return analyse(m.step_time_s, spans);
}

// The job's view of one step: the slowest rank's time, the ranks' mean of the rest.
StepView over_ranks(const Trainer& t, const StepView& v) {
  const double W = t.world_size();
  StepView out;
  out.step_s = t.max_over_ranks(v.step_s);
  out.compute_s = t.sum_over_ranks(v.compute_s) / W;
  out.comm_s = t.sum_over_ranks(v.comm_s) / W;
  out.exposed_comm_s = t.sum_over_ranks(v.exposed_comm_s) / W;
  out.link_s = t.sum_over_ranks(v.link_s) / W;
  for (size_t c = 0; c < kRows; ++c) {
    out.class_s[c] = t.sum_over_ranks(v.class_s[c]) / W;
    out.exposed_s[c] = t.sum_over_ranks(v.exposed_s[c]) / W;
  }
  return out;
}

// The element-wise median of the steps.
StepView median_of(const std::vector<StepView>& steps) {
  auto med = [&](auto get) {
    std::vector<double> v;
    for (const StepView& s : steps) v.push_back(get(s));
    return median(v);
  };
  StepView m;
  m.step_s = med([](const StepView& s) { return s.step_s; });
  m.compute_s = med([](const StepView& s) { return s.compute_s; });
  m.comm_s = med([](const StepView& s) { return s.comm_s; });
  m.exposed_comm_s = med([](const StepView& s) { return s.exposed_comm_s; });
  m.link_s = med([](const StepView& s) { return s.link_s; });
  for (size_t c = 0; c < kRows; ++c) {
    m.class_s[c] = med([c](const StepView& s) { return s.class_s[c]; });
    m.exposed_s[c] = med([c](const StepView& s) { return s.exposed_s[c]; });
  }
  return m;
}

int run_bench_overlap(const OverlapArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  cfg.metrics.progress = ProgressMode::off;
  cfg.training.steps =
      std::max<int64_t>(cfg.training.steps, args.common.warmup + 2 * args.common.iters);
  Trainer trainer(cfg, TrainOptions{});
  const bool root = trainer.rank() == 0;
  const int W = trainer.world_size();
  const double link = cfg.runtime.cpu_link_gb_per_s * 1e9;  // B/s, 0 = off
  const double ceiling = trainer.gemm_ceiling_gflops() * 1e9;
  if (root) {
    std::printf("# moepeak bench overlap: %s\n", trainer.describe().c_str());
    std::printf("# host %s, %s; world %d; zero_prefetch_depth %lld; dispatch %s, vocab %s\n",
                process_host().c_str(), now_utc().c_str(), W,
                static_cast<long long>(cfg.parallelism.zero_prefetch_depth),
                std::string(enum_name(cfg.schedules.dispatch)).c_str(),
                std::string(enum_name(cfg.schedules.vocab)).c_str());
    if (link > 0) {
      std::printf(
          "# link model %.4g GB/s + %.4g us per operation, %s waits; GEMM ceiling %.2f GFLOP/s "
          "per rank: %.0f FLOP per link byte\n",
          cfg.runtime.cpu_link_gb_per_s, cfg.runtime.cpu_link_latency_us,
          std::string(enum_name(cfg.runtime.cpu_comm_wait)).c_str(), ceiling / 1e9, ceiling / link);
    } else {
      std::printf("# link model off: communication runs at shared-memory speed\n");
    }
  }
  for (int i = 0; i < args.common.warmup; ++i) trainer.step();
  std::vector<StepView> overlap, serial;
  for (int i = 0; i < args.common.iters; ++i) {
    overlap.push_back(over_ranks(trainer, timed_step(trainer, false)));
    serial.push_back(over_ranks(trainer, timed_step(trainer, true)));
  }
  const StepView o = median_of(overlap), s = median_of(serial);
  if (!root) return 0;

  // Alone: compute as the serial steps run it; communication as the link model charges the
  // step's operations (one link, so they add), which excludes waiting for a slower rank.
  const double compute_alone = s.compute_s, comm_alone = o.link_s;
  const double bound = std::max(compute_alone, comm_alone);
  std::printf(
      "# alone: compute %.4f s (the serial steps' compute tasks), communication %.4f s (the link "
      "model's charge for the step's operations); max %.4f s, sum %.4f s\n",
      compute_alone, comm_alone, bound, compute_alone + comm_alone);
  std::printf("# compute_s, comm_s: time covered by compute / communication tasks in that mode\n");
  std::printf("# %-8s %10s %10s %10s %10s %10s\n", "mode", "step_s", "compute_s", "comm_s",
              "step/max", "step/sum");
  auto row = [&](const char* name, const StepView& v) {
    std::printf("  %-8s %10.4f %10.4f %10.4f %10.3f %10.3f\n", name, v.step_s, v.compute_s,
                v.comm_s, v.step_s / bound, v.step_s / (compute_alone + comm_alone));
  };
  row("overlap", o);
  row("serial", s);
  std::printf(
      "# exposed communication in the overlap steps (no compute task running; classes may run at "
      "once)\n");
  std::printf("# %-20s %10s %10s %9s\n", "traffic", "comm_s", "exposed_s", "exposed");
  for (size_t c = 0; c < kRows; ++c) {
    const char* name = c < kOther ? kClasses[c] : "other";
    const double frac = o.class_s[c] > 0 ? o.exposed_s[c] / o.class_s[c] : 0.0;
    std::printf("  %-20s %10.4f %10.4f %8.1f%%\n", name, o.class_s[c], o.exposed_s[c],
                100.0 * frac);
  }
  std::printf(
      "# median of %d steps each: overlap %.4f s = %.3f x max(compute, comm) = %.3f x the "
      "serial step; communication exposed %.1f%%\n",
      args.common.iters, o.step_s, o.step_s / bound, o.step_s / s.step_s,
      o.comm_s > 0 ? 100.0 * o.exposed_comm_s / o.comm_s : 0.0);

  if (!args.common.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [name, v] : {std::pair{"overlap", o}, std::pair{"serial", s}}) {
      nlohmann::json traffic;
      for (size_t c = 0; c < kRows; ++c) {
        traffic[c < kOther ? kClasses[c] : "other"] = {{"comm_s", v.class_s[c]},
                                                       {"exposed_s", v.exposed_s[c]}};
      }
      rows.push_back({{"schedule", name},
                      {"time_s", v.step_s},
                      {"peak_bytes", nullptr},
                      {"bound_bytes", nullptr},
                      {"max_rel_err", 0.0},
                      {"compute_s", v.compute_s},
                      {"comm_s", v.comm_s},
                      {"exposed_comm_s", v.exposed_comm_s},
                      {"link_s", v.link_s},
                      {"traffic", traffic}});
    }
    const nlohmann::json shape = {{"batch", cfg.training.batch_size},
                                  {"seq_len", cfg.training.seq_len},
                                  {"hidden_size", cfg.model.hidden_size},
                                  {"num_hidden_layers", cfg.model.num_hidden_layers},
                                  {"num_local_experts", cfg.model.num_local_experts},
                                  {"link_gb_per_s", cfg.runtime.cpu_link_gb_per_s},
                                  {"comm_wait", enum_name(cfg.runtime.cpu_comm_wait)},
                                  {"zero_prefetch_depth", cfg.parallelism.zero_prefetch_depth},
                                  {"flop_per_link_byte", link > 0 ? ceiling / link : 0.0}};
    write_bench_json(args.common.json_path, "overlap", W, shape, rows);
  }
  return 0;
}

}  // namespace

void register_bench_overlap(CLI::App& bench, Context& ctx) {
  static OverlapArgs args;
  auto* sub = bench.add_subcommand(
      "overlap", "step time with communication overlapped against every wait made blocking");
  add_bench_common_options(*sub, args.common);
  sub->callback([&ctx] {
    ctx.action = [&ctx] {
      join_ranks();
      int rc = run_bench_overlap(args, ctx);
      finalize_process_group();
      return rc;
    };
  });
}

}  // namespace moepeak::cli
