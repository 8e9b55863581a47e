// `moepeak bench adamw`: one optimizer step of each AdamW placement over the same parameters and
// gradients — resident, the serial CPU offload (ZeRO-Offload's schedule) and OffloadStreamAdamW
// with a sweep of bucket size beta and staging slots s — beside the host-link floor: 12 bytes per
// parameter each way (master, m, v) at the pinned copy bandwidth measured in the same run.
//
//   moepeak bench adamw [--config F]... [--set k=v]... [--params 16777216] [--buckets 262144,...]
//                       [--slots 2,3,4] [--threads 0] [--dtype f32|bf16] [--warmup 2] [--iters 5]
//                       [--json FILE]
//
// --dtype is the working weights': f32 (they are the master), or bf16 as a bf16 run has them —
// fp32 gradients (the main gradients) and an fp32 master, m and v beside them; the serial
// offload then copies fp32 gradients down and bf16 weights up (ZeRO-Offload's traffic in a
// mixed-precision run), OffloadStreamAdamW streams the fp32 state as in f32.
// Every row starts from the same weights and runs the same steps with the same gradients, so
// its final weights, m, v (and master) must be bitwise resident's (max_rel_err 0; the bench
// checks it). `time_s` is the median of the timed steps (step() to the stream being idle);
// `staging` the measured device `optimizer` peak, `bound` and `host` the optimizer's device and
// pinned host bytes as the planner has them (schedules::optimizer_bytes). The parameters are one
// flat buffer cut into pieces like a model's (every fourth without weight decay, as norms are).
// Under mpirun every rank runs its share (--params / W) at once and the slowest rank's time is
// reported.
//
// runtime.backend = "cuda" runs it on the rank's GPU: resident and OffloadStreamAdamW update on
// the GPU (the three copy/update streams of adamw_offload_stream.h over the pinned, NUMA-local
// host state), the serial offload on the host's cores; the header then states the GPU target's
// target — OffloadStreamAdamW within 1.25x of the link floor and at least 5x faster than the
// issue's serial CPU offload anchor (380 ms for 268M parameters, scaled to --params) — and
// whether the best offload_stream row meets it; its speedup over our own serial offload is shown
// too. On the CPU backend the figures have no target: "device" and "host" are the same memory,
// the copies are memcpy on the copy streams' threads and the host link is the memory bus.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/measure/adamw_measure.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/schedules/optimizer_choice.h"

namespace moepeak::cli {

using namespace measure;  // the measurement this command prints (core/measure)
namespace {

// The GPU target for OffloadStreamAdamW (268M parameters on one H200): within 1.25x of the
// link floor and 5x faster than its anchor, PyTorch's serial CPU AdamW offload at 380 ms.
// NOTES: the 5x is against the anchor, not our own serial offload: the two thresholds meet there
// (380 / 5 = 76 ms = 1.25 x the 61 ms floor at 53 GB/s), while 5x a faster serial offload of ours
// (vectorised, multi-threaded) can lie below the link floor.
constexpr double kFloorTarget = 1.25;
constexpr double kSerialTarget = 5.0;
constexpr double kSerialAnchorSeconds = 0.380;
constexpr double kSerialAnchorParams = 268435456;

struct AdamwBenchArgs {
  BenchCommonArgs common;
  int64_t params = 16777216;
  std::vector<int64_t> buckets = {262144, 1048576, 4194304};
  std::vector<int64_t> slots = {2, 3, 4};
  int threads = 0;
  std::string dtype = "f32";  // the working weights': f32 or bf16
};

struct Row {
  std::string schedule;
  int64_t bucket = 0, slots = 0;  // offload_stream only
  double time_s = 0;
  MemoryStats peaks;
  uint64_t bound = 0, host_bytes = 0;
  double max_rel_err = 0;
};

int run_bench_adamw(const AdamwBenchArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  const RankInfo ranks = join_ranks();
  const int W = ranks.world_size;
  const bool root = ranks.rank == 0;
  const int64_t count = (args.params + W - 1) / W;  // this rank's parameters
  int64_t max_bucket = cfg.optimizer.bucket_params;
  int64_t max_slots = cfg.optimizer.staging_slots;
  for (int64_t b : args.buckets) max_bucket = std::max(max_bucket, b);
  for (int64_t s : args.slots) max_slots = std::max(max_slots, s);

  // The bench sizes its device and pinned pool to what the rows need (a model of its own).
  const uint64_t bw_bytes = adamw_bandwidth_bytes(count);
  const DType working = bench_dtype(args.dtype);
  const BackendOptions bo =
      adamw_backend_options(cfg, ranks, count, max_bucket, max_slots, args.threads, working);
  auto backend = Backend::create(bo);
  auto comm = make_comm(*backend, ranks);
  Stream& stream = backend->default_stream();
  const int threads = adamw_host_threads(bo, ranks);

  AdamwParams p = make_adamw_params(*backend, count, working, stream);
  const LinkBandwidth link = pinned_bandwidth(*backend, bw_bytes, stream);
  double bw[3] = {link.h2d, link.d2h, link.both_ways};
  if (W > 1) all_reduce_host(*comm, *backend, stream, bw, ReduceOp::min);
  const double state_bytes = 12.0 * static_cast<double>(count);
  const double floor_h2d = state_bytes / bw[0], floor_d2h = state_bytes / bw[1];
  // NOTES: a GPU's host link is full duplex, so the two directions overlap: the floor is the
  // slower direction, not the sum (the paper's 12 Theta / W bytes at the one-way rate; the
  // target is against it). On the CPU backend both are the same memory bus.
  const double floor_s = std::max(floor_h2d, floor_d2h);
  // What the link gives per direction while both run, as the schedule's traffic does: the time
  // no bucket size can beat. Shown beside the floor, so a missed target says whether the
  // schedule or the link is short.
  const double both_ways_floor_s = state_bytes / bw[2];

  std::vector<Row> rows;
  AdamwRun reference;  // resident's weights, m, v (and master) after the last step
  const int64_t E = p.elements;
  auto run_row = [&](OptimizerPlacement placement, OptimizerConfig o) {
    reset_adamw_params(*backend, p, stream);
    o.placement = placement;
    auto opt = make_adamw(*backend, p, o, threads);
    AdamwRun run = time_adamw(*backend, p, *opt, args.common.warmup, args.common.iters, stream);
    // NOTES: resident's own row compares it with itself (0); it is kept after that, moved.
    const bool first = rows.empty();
    if (first) reference = std::move(run);  // resident: what every row must equal
    const AdamwRun& mine = first ? reference : run;
    const schedules::OptimizerBytes bytes = schedules::optimizer_bytes(o, E, working);
    Row row;
    row.time_s = median(mine.times);
    row.peaks = mine.peaks;
    row.max_rel_err =
        std::max({float_max_rel_err(mine.weights, reference.weights),
                  float_max_rel_err(mine.m, reference.m), float_max_rel_err(mine.v, reference.v),
                  mine.master.size() == reference.master.size()
                      ? float_max_rel_err(mine.master, reference.master)
                      : 1.0});
    row.schedule = std::string(enum_name(placement));
    row.bound = bytes.device.bytes;
    row.host_bytes = bytes.host_total();
    if (o.placement == OptimizerPlacement::offload_stream) {
      row.bucket = o.bucket_params;
      row.slots = o.staging_slots;
    }
    rows.push_back(std::move(row));
  };
  run_row(OptimizerPlacement::resident, cfg.optimizer);
  run_row(OptimizerPlacement::offload_serial, cfg.optimizer);
  std::vector<std::pair<int64_t, int64_t>> sweep = {
      {cfg.optimizer.bucket_params, cfg.optimizer.staging_slots}};
  for (int64_t b : args.buckets) {
    for (int64_t s : args.slots) {
      if (std::find(sweep.begin(), sweep.end(), std::pair{b, s}) == sweep.end())
        sweep.push_back({b, s});
    }
  }
  for (const auto& [b, s] : sweep) {
    OptimizerConfig o = cfg.optimizer;
    o.bucket_params = b;
    o.staging_slots = s;
    run_row(OptimizerPlacement::offload_stream, o);
  }
  // Exactness against resident, and the slowest rank's times.
  std::vector<double> times;
  for (Row& r : rows) {
    times.push_back(r.time_s);
    times.push_back(r.max_rel_err);
  }
  max_over_ranks(*comm, *backend, times);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].time_s = times[2 * i];
    rows[i].max_rel_err = times[2 * i + 1];
  }
  // The fastest OffloadStreamAdamW row, judged against the GPU target.
  size_t best_stream = 2;
  for (size_t i = 2; i < rows.size(); ++i) {
    if (rows[i].time_s < rows[best_stream].time_s) best_stream = i;
  }
  const bool on_gpu = backend->kind() == BackendKind::cuda;
  const double serial_s = rows[1].time_s;
  const double anchor_s =
      kSerialAnchorSeconds * static_cast<double>(args.params) / kSerialAnchorParams;
  const bool target_met = rows[best_stream].time_s <= kFloorTarget * floor_s &&
                          anchor_s >= kSerialTarget * rows[best_stream].time_s;
  bool all_exact = true;
  for (const Row& r : rows) {
    all_exact =
        all_exact && r.max_rel_err == 0 && r.peaks.peak_per_set()[LiveSet::optimizer] == r.bound;
  }

  if (root) {
    std::printf(
        "# moepeak bench adamw: %lld parameters (%lld per rank, %lld pieces), world %d; %s\n",
        static_cast<long long>(args.params), static_cast<long long>(count),
        static_cast<long long>(kAdamwPieces), W,
        working == DType::bf16 ? "bf16 working weights, fp32 gradients, fp32 master, m, v"
                               : "f32 working weights (the master), gradients, m, v");
    std::printf("# backend %s; host %s, %s\n", backend->describe().c_str(), process_host().c_str(),
                now_utc().c_str());
    std::printf(
        "# pinned copy bandwidth (best of 6, %s): host->device %.2f GB/s, device->host %.2f GB/s; "
        "both at once %.2f GB/s each way\n",
        format_bytes(bw_bytes).c_str(), bw[0] / 1e9, bw[1] / 1e9, bw[2] / 1e9);
    std::printf(
        "# host-link floor: 12 B/param each way = %.4f s host->device, %.4f s device->host; "
        "floor %.4f s (the slower way; a full-duplex link overlaps them); at the both-ways rate "
        "%.4f s (%.2fx floor)\n",
        floor_h2d, floor_d2h, floor_s, both_ways_floor_s, both_ways_floor_s / floor_s);
    std::printf(
        "# serial offload: host AdamW on %d thread%s (AVX2 %s); median of %d steps after %d "
        "warm-up%s\n",
        threads, threads == 1 ? "" : "s", ops::adamw_avx2_available() ? "on" : "off",
        args.common.iters, args.common.warmup, on_gpu ? "" : "; target: none on the CPU backend");
    std::printf("# %-15s %9s %3s %10s %9s %9s %12s %12s %12s %11s\n", "schedule", "beta", "s",
                "time_s", "x floor", "x serial", "staging", "bound", "host", "max_rel_err");
    for (const Row& r : rows) {
      const std::string beta = r.bucket ? std::to_string(r.bucket) : "-";
      const std::string s = r.slots ? std::to_string(r.slots) : "-";
      std::printf("  %-15s %9s %3s %10.4f %9.2f %9.2f %12s %12s %12s %11.3g\n", r.schedule.c_str(),
                  beta.c_str(), s.c_str(), r.time_s, r.time_s / floor_s, serial_s / r.time_s,
                  format_bytes(r.peaks.peak_per_set()[LiveSet::optimizer]).c_str(),
                  format_bytes(r.bound).c_str(), format_bytes(r.host_bytes).c_str(), r.max_rel_err);
    }
    std::printf("# every row bitwise resident and its staging peak equal to its bound: %s\n",
                all_exact ? "yes" : "NO");
    if (on_gpu) {
      const Row& b = rows[best_stream];
      std::printf(
          "# target (GPU): offload_stream within %.2fx of the floor and >= %.0fx faster than the "
          "serial offload anchor (%.1f ms: 380 ms per 268M parameters); best row beta %lld, s "
          "%lld: %.2fx floor, %.2fx anchor (%.2fx our serial offload): %s\n",
          kFloorTarget, kSerialTarget, anchor_s * 1e3, static_cast<long long>(b.bucket),
          static_cast<long long>(b.slots), b.time_s / floor_s, anchor_s / b.time_s,
          serial_s / b.time_s, target_met ? "met" : "NOT met");
    }
  }
  if (root && !args.common.json_path.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json row = {{"schedule", r.schedule},
                            {"time_s", r.time_s},
                            {"peak_bytes", peak_bytes_json(r.peaks)},
                            {"bound_bytes", r.bound},
                            {"max_rel_err", r.max_rel_err},
                            {"host_bytes", r.host_bytes},
                            {"floor_ratio", r.time_s / floor_s}};
      if (r.bucket) {
        row["bucket_params"] = r.bucket;
        row["staging_slots"] = r.slots;
      }
      out.push_back(row);
    }
    nlohmann::json shape = {{"params", args.params},
                            {"params_per_rank", count},
                            {"dtype", args.dtype},
                            {"h2d_bytes_per_s", bw[0]},
                            {"d2h_bytes_per_s", bw[1]},
                            {"floor_s", floor_s},
                            {"both_ways_bytes_per_s", bw[2]},
                            {"both_ways_floor_s", both_ways_floor_s},
                            {"host_threads", threads},
                            {"backend", backend_kind_name(backend->kind())}};
    if (on_gpu) {
      shape["target"] = {{"floor_ratio_max", kFloorTarget},
                         {"serial_speedup_min", kSerialTarget},
                         {"met", target_met}};
    }
    write_bench_json(args.common.json_path, "adamw", W, shape, out);
  }
  finalize_process_group();
  return all_exact ? 0 : 1;
}

}  // namespace

void register_bench_adamw(CLI::App& bench, Context& ctx) {
  static AdamwBenchArgs args;
  auto* cmd = bench.add_subcommand(
      "adamw", "optimizer step: resident vs serial CPU offload vs OffloadStreamAdamW");
  add_bench_common_options(*cmd, args.common);
  cmd->add_option("--params", args.params, "parameters (over all ranks)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 36));
  cmd->add_option("--buckets", args.buckets, "OffloadStreamAdamW bucket sizes beta to sweep")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--slots", args.slots, "staging slot counts s to sweep")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  cmd->add_option("--threads", args.threads,
                  "host AdamW threads of the serial offload (0 = the rank's cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", args.dtype,
                  "working weights: f32, or bf16 with fp32 gradients and an fp32 master")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([&ctx] { ctx.action = [&ctx] { return run_bench_adamw(args, ctx); }; });
}

}  // namespace moepeak::cli
