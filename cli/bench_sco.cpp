// `moepeak bench sco`: standard checkpointing beside SCO (ops/schedules/checkpoint_sco.h) over a
// sweep of host budgets — none, half the layers, all of them — on one rank of the CPU backend:
// the device `boundaries` peak and its bound, SCO's pinned host bytes, and the forward + backward
// time of a step (the part SCO changes; no optimizer), with the gradients checked bitwise
// against standard.
//
//   moepeak bench sco [--config F]... [--set k=v]... [--warmup 1] [--iters 5] [--json FILE]
//
// One model per row, all resident at once; the rows take turns in every repetition, each
// repetition starting with the next row, so a machine whose speed drifts (a shared VM) slows them
// alike. `copy_s` is what the row's copies would cost serially (one boundary device -> host and
// back, timed alone on this machine, times |S|); `overhead_s` is what the row measured above
// standard; the budget-0 SCO row does standard's work and shows the machine's noise. SCO is per
// rank and needs no communication, so the bench runs one rank. The JSON's peaks are each row's
// own (the other rows' resident weights and grads subtracted). docs/perf.md has the command and
// results (`-c configs/small.toml --set training.batch_size=1`, ~40 s on 2 cores).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/model/mixtral.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/schedules/checkpoint_sco.h"

namespace moepeak::cli {
namespace {

struct ScoBenchArgs {
  BenchCommonArgs common;
};

using Clock = std::chrono::steady_clock;
constexpr DType kDtype = DType::f32;

// One row of the sweep: its model and what it measured.
struct Row {
  Row(std::string label, CheckpointSchedule checkpoint, std::optional<uint64_t> host_budget)
      : label(std::move(label)), checkpoint(checkpoint), host_budget(host_budget) {}

  std::string label;                    // "standard", "sco none", "sco half", "sco all"
  CheckpointSchedule checkpoint;
  std::optional<uint64_t> host_budget;  // SCO's schedules.sco_host_budget (bytes)
  std::unique_ptr<MixtralModel> model;
  MemorySnapshot resident;              // the model's own weights and grads in the arena, per set
  std::vector<double> times;
  double loss = 0;
  MemoryStats device, host;
  int64_t offloaded = 0;
};

// Seconds to copy one (N, H) boundary device -> host and back on a stream of its own: the median
// of 7 after one untimed.
double boundary_round_trip_s(Backend& backend, int64_t tokens, int64_t hidden) {
  OwnedTensor device = OwnedTensor::device(backend, Shape{tokens, hidden}, kDtype, LiveSet::workspace,
                                           "bench copy");
  OwnedTensor host = OwnedTensor::pinned(backend, Shape{tokens, hidden}, kDtype, LiveSet::workspace,
                                         "bench copy");
  std::unique_ptr<Stream> stream = backend.create_stream("bench copy");
  backend.memset_async(device.data(), 1, device.nbytes(), *stream);
  std::vector<double> times;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = Clock::now();
    backend.copy_async(host.data(), device.data(), device.nbytes(), CopyKind::device_to_host, *stream);
    backend.copy_async(device.data(), host.data(), device.nbytes(), CopyKind::host_to_device, *stream);
    stream->synchronize();
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(times);
}

uint64_t sco_host_bytes_one(int64_t tokens, int64_t hidden) {
  return schedules::sco_host_bytes(1, tokens, hidden, kDtype);
}

double max_rel_err(const Tensor& a, const Tensor& b) {
  const float* x = a.data_as<float>();
  const float* y = b.data_as<float>();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::abs(static_cast<double>(x[i]) - y[i]);
    const double scale = std::max({std::abs(static_cast<double>(x[i])), std::abs(static_cast<double>(y[i])), 1e-30});
    worst = std::max(worst, d / scale);
  }
  return worst;
}

int run_bench_sco(const ScoBenchArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  const ModelConfig& m = cfg.model;
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len, N = B * T;
  const int64_t H = m.hidden_size, L = m.num_hidden_layers;
  MixtralModel::check_layout(m, B, T, 1);

  // The sweep's host budgets: exactly what none, half and all of the layers need.
  const uint64_t half_budget = schedules::sco_host_bytes(L / 2, N, H, kDtype);
  const uint64_t all_budget = schedules::sco_host_bytes(L, N, H, kDtype);
  BackendOptions options;
  options.kind = BackendKind::cpu;
  options.device_memory = cfg.runtime.device_memory_bytes().value_or(0);
  // NOTES: the pool caches freed blocks by size, so it must hold the "all" and "half" rows' blocks
  // at once, plus the copy-timing buffer.
  options.pinned_budget = std::max(cfg.runtime.pinned_memory_bytes().value_or(GiB),
                                   all_budget + half_budget + sco_host_bytes_one(N, H));
  options.numa_node = static_cast<int>(cfg.runtime.numa_node);
  options.cpu_threads = static_cast<int>(cfg.runtime.threads);
  std::unique_ptr<Backend> backend = Backend::create(options);
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm = make_comm(*backend, RankInfo{});

  // One batch of random tokens, the same for every row.
  OwnedTensor ids = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "ids");
  OwnedTensor labels = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
  OwnedTensor positions = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.job.seed));
  std::uniform_int_distribution<int64_t> token(0, m.vocab_size - 1);
  for (int64_t n = 0; n < N; ++n) ids.data_as<int64_t>()[n] = token(rng);
  for (int64_t n = 0; n < N; ++n) {
    labels.data_as<int64_t>()[n] = n % T == T - 1 ? -100 : ids.data_as<int64_t>()[n + 1];
    positions.data_as<int64_t>()[n] = n % T;
  }
  const int64_t scored = N - B;
  const TokenBatch batch{ids, labels, positions, B, T, scored};

  std::vector<Row> rows;
  rows.emplace_back("standard", CheckpointSchedule::standard, std::nullopt);
  rows.emplace_back("sco none", CheckpointSchedule::sco, uint64_t{0});
  rows.emplace_back("sco half", CheckpointSchedule::sco, half_budget);
  rows.emplace_back("sco all", CheckpointSchedule::sco, all_budget);
  for (Row& r : rows) {
    SchedulesConfig s = cfg.schedules;
    s.checkpoint = r.checkpoint;
    if (r.host_budget) s.sco_host_budget = std::to_string(*r.host_budget);
    const MemorySnapshot before = backend->arena().stats().current();
    r.model = std::make_unique<MixtralModel>(*backend, stream, *comm, m, s, kDtype);
    if (&r == &rows.front()) {
      r.model->params().initialize(static_cast<uint64_t>(cfg.job.seed), m.initializer_range, stream);
    } else {  // the same weights, copied (initialising is slow for a 50M-parameter model)
      const Tensor from = rows.front().model->params().flat_values();
      backend->copy_async(r.model->params().flat_values().data(), from.data(), from.nbytes(),
                          CopyKind::device_to_device, stream);
    }
    stream.synchronize();
    const MemorySnapshot after = backend->arena().stats().current();
    for (size_t set = 0; set < kNumLiveSets; ++set) r.resident.bytes[set] = after.bytes[set] - before.bytes[set];
  }
  MemorySnapshot all_resident;
  for (const Row& r : rows) {
    for (size_t set = 0; set < kNumLiveSets; ++set) all_resident.bytes[set] += r.resident.bytes[set];
  }
  const double round_trip = boundary_round_trip_s(*backend, N, H);
  const uint64_t one = DeviceArena::footprint(static_cast<uint64_t>(N * H) * dtype_size(kDtype));

  std::printf("# moepeak bench sco: %s\n", backend->describe().c_str());
  std::printf("# host %s, %s; one rank; batch %lld x seq %lld = %lld tokens, hidden %lld, %lld layers, "
              "%lld experts top-%lld of width %lld, vocab %lld\n",
              process_host().c_str(), now_utc().c_str(), static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(N), static_cast<long long>(H),
              static_cast<long long>(L), static_cast<long long>(m.num_local_experts),
              static_cast<long long>(m.num_experts_per_tok), static_cast<long long>(m.intermediate_size),
              static_cast<long long>(m.vocab_size));
  std::printf("# one boundary (N x H f32) %s; device -> host -> device alone: %.3f ms\n",
              format_bytes(one).c_str(), 1e3 * round_trip);
  std::printf("# forward + backward per step (no optimizer), median of %d after %d warm-up; rows take turns\n",
              args.common.iters, args.common.warmup);

  for (int i = 0; i < args.common.warmup + args.common.iters; ++i) {
    for (size_t k = 0; k < rows.size(); ++k) {
      Row& r = rows[(k + static_cast<size_t>(i)) % rows.size()];  // each row goes first in turn
      r.model->params().zero_grads(stream);
      stream.synchronize();
      backend->arena().reset_peaks();
      backend->pinned().reset_peaks();
      const auto t0 = Clock::now();
      r.loss = r.model->forward_backward(batch, scored);
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= args.common.warmup) r.times.push_back(t);
      r.device = backend->arena().stats();
      r.host = backend->pinned().stats();
      auto* sco = dynamic_cast<schedules::ScoBoundaries*>(&r.model->boundaries());
      r.offloaded = sco != nullptr ? sco->offloaded_layers() : 0;
    }
  }

  const double t_standard = median(rows.front().times);
  const Tensor reference = rows.front().model->params().flat_grads();
  std::printf("# %-9s %11s %9s %12s %12s %11s %9s %10s %8s %9s %s\n", "schedule", "host_budget",
              "offloaded", "boundaries", "bound", "host_bytes", "time_s", "overhead_s", "overhead",
              "copy_s", "vs standard");
  nlohmann::json json_rows = nlohmann::json::array();
  for (const Row& r : rows) {
    const double t = median(r.times);
    const uint64_t peak = r.device.peak_per_set()[LiveSet::boundaries];
    const uint64_t bound = r.checkpoint == CheckpointSchedule::standard
                               ? schedules::boundaries_standard_bytes(L, N, H, kDtype)
                               : schedules::sco_boundaries_bytes(L, r.offloaded, N, H, kDtype);
    const uint64_t host = r.host.peak_per_set()[LiveSet::boundaries];
    const double err = max_rel_err(reference, r.model->params().flat_grads());
    const bool bitwise = err == 0 && r.loss == rows.front().loss;
    const double copy_s = static_cast<double>(r.offloaded) * round_trip;
    std::printf("  %-9s %11s %5lld/%-3lld %12s %12s %11s %9.4f %10.4f %7.1f%% %9.4f %s\n", r.label.c_str(),
                r.host_budget ? format_bytes(*r.host_budget).c_str() : "-",
                static_cast<long long>(r.offloaded), static_cast<long long>(L),
                format_bytes(peak).c_str(), format_bytes(bound).c_str(), format_bytes(host).c_str(), t,
                t - t_standard, 100.0 * (t - t_standard) / t_standard, copy_s,
                bitwise ? "bitwise equal" : ("max rel err " + std::to_string(err)).c_str());
    // NOTES: every row's model stays resident during every row's step; the step's peaks are
    // reported without the other rows' weights and grads, as if it ran alone.
    nlohmann::json peak_bytes = peak_bytes_json(r.device);
    nlohmann::json breakdown;  // the live sets at the moment of the total peak
    for (LiveSet set : kAllLiveSets) {
      const uint64_t others = all_resident[set] - r.resident[set];
      const std::string name(live_set_name(set));
      peak_bytes[name] = r.device.peak_per_set()[set] - others;
      breakdown[name] = r.device.at_peak()[set] - others;
    }
    peak_bytes["total"] = r.device.peak_total() - (all_resident.total() - r.resident.total());
    json_rows.push_back({{"schedule", r.checkpoint == CheckpointSchedule::standard ? "standard" : "sco"},
                         {"label", r.label},
                         {"host_budget_bytes", r.host_budget ? nlohmann::json(*r.host_budget) : nlohmann::json()},
                         {"offloaded_layers", r.offloaded},
                         {"time_s", t},
                         {"peak_bytes", peak_bytes},
                         {"peak_breakdown_bytes", breakdown},
                         {"host_bytes", host},
                         {"bound_bytes", bound},
                         {"copy_s", copy_s},
                         {"max_rel_err", err}});
  }
  const Row& all = rows.back();
  std::printf("# every layer offloaded: boundaries peak %s = %.3f of standard's %s (2 of L + 1 = %lld "
              "boundaries, the final hidden state counted in both)\n",
              format_bytes(all.device.peak_per_set()[LiveSet::boundaries]).c_str(),
              static_cast<double>(all.device.peak_per_set()[LiveSet::boundaries]) /
                  static_cast<double>(rows.front().device.peak_per_set()[LiveSet::boundaries]),
              format_bytes(rows.front().device.peak_per_set()[LiveSet::boundaries]).c_str(),
              static_cast<long long>(L + 1));

  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"batch", B}, {"seq_len", T}, {"tokens", N}, {"hidden_size", H},
                            {"num_hidden_layers", L}, {"num_local_experts", m.num_local_experts},
                            {"num_experts_per_tok", m.num_experts_per_tok},
                            {"intermediate_size", m.intermediate_size}, {"vocab_size", m.vocab_size},
                            {"boundary_bytes", one}, {"round_trip_s", round_trip}};
    write_bench_json(args.common.json_path, "sco", 1, shape, json_rows);
  }
  for (const Row& r : rows) {
    MOEPEAK_CHECK(r.loss == rows.front().loss && max_rel_err(reference, r.model->params().flat_grads()) == 0,
                  "bench sco: ", r.label, " is not bitwise equal to standard checkpointing");
  }
  return 0;
}

}  // namespace

void register_bench_sco(CLI::App& bench, Context& ctx) {
  static ScoBenchArgs args;
  args.common.warmup = 1;
  args.common.iters = 5;
  auto* sco = bench.add_subcommand(
      "sco", "checkpoint boundaries: standard vs SCO over host budgets (none, half, all layers)");
  add_bench_common_options(*sco, args.common);
  sco->callback([&ctx] {
    ctx.action = [&ctx] { return run_bench_sco(args, ctx); };
  });
}

}  // namespace moepeak::cli
