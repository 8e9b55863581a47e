// `moepeak bench sco`: standard checkpointing beside SCO (ops/schedules/checkpoint_sco.h) over a
// sweep of host budgets — none, half the layers, all of them — on one rank (runtime.backend: the
// CPU, or one GPU with SCO's copy stream and its pinned, NUMA-local host blocks; f32 either way):
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
#include "core/measure/sco_measure.h"
#include "core/model/decoder.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/schedules/checkpoint_sco.h"

namespace moepeak::cli {

using namespace measure;  // the measurement this command prints (core/measure)
namespace {

struct ScoBenchArgs {
  BenchCommonArgs common;
};

constexpr DType kDtype = DType::f32;

int run_bench_sco(const ScoBenchArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  const ModelConfig& m = cfg.model;
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len, N = B * T;
  const int64_t H = m.hidden_size, L = m.num_hidden_layers;
  DecoderModel::check_layout(m, B, T, 1);

  std::unique_ptr<Backend> backend = Backend::create(sco_backend_options(cfg, RankInfo{}, B, T));
  ScoSweep sweep = measure_sco_sweep(*backend, cfg, B, T, args.common.warmup, args.common.iters);
  std::vector<ScoRow>& rows = sweep.rows;
  const MemorySnapshot& all_resident = sweep.all_resident;
  const double round_trip = sweep.round_trip_s;
  const uint64_t one = sweep.boundary_bytes;

  std::printf("# moepeak bench sco: %s\n", backend->describe().c_str());
  std::printf(
      "# host %s, %s; one rank; batch %lld x seq %lld = %lld tokens, hidden %lld, %lld layers, "
      "%lld experts top-%lld of width %lld, vocab %lld\n",
      process_host().c_str(), now_utc().c_str(), static_cast<long long>(B),
      static_cast<long long>(T), static_cast<long long>(N), static_cast<long long>(H),
      static_cast<long long>(L), static_cast<long long>(m.num_local_experts),
      static_cast<long long>(m.num_experts_per_tok), static_cast<long long>(m.intermediate_size),
      static_cast<long long>(m.vocab_size));
  std::printf("# one boundary (N x H f32) %s; device -> host -> device alone: %.3f ms\n",
              format_bytes(one).c_str(), 1e3 * round_trip);
  std::printf(
      "# forward + backward per step (no optimizer), median of %d after %d warm-up; rows take "
      "turns\n",
      args.common.iters, args.common.warmup);

  const double t_standard = median(rows.front().times);
  Stream& stream = backend->default_stream();
  auto grads_of = [&](const ScoRow& r) {
    return copy_to_host_as_double(r.model->params().flat_grads(), *backend, stream);
  };
  const std::vector<double> reference = grads_of(rows.front());
  std::vector<double> errors;
  std::printf("# %-9s %11s %9s %12s %12s %11s %9s %10s %8s %9s %s\n", "schedule", "host_budget",
              "offloaded", "boundaries", "bound", "host_bytes", "time_s", "overhead_s", "overhead",
              "copy_s", "vs standard");
  nlohmann::json json_rows = nlohmann::json::array();
  for (const ScoRow& r : rows) {
    const double t = median(r.times);
    const uint64_t peak = r.device.peak_per_set()[LiveSet::boundaries];
    const uint64_t bound = r.checkpoint == CheckpointSchedule::standard
                               ? schedules::boundaries_standard_bytes(L, N, H, kDtype)
                               : schedules::sco_boundaries_bytes(L, r.offloaded, N, H, kDtype);
    const uint64_t host = r.host.peak_per_set()[LiveSet::boundaries];
    const double err = sco_max_rel_err(reference, grads_of(r));
    errors.push_back(err);
    const bool bitwise = err == 0 && r.loss == rows.front().loss;
    const double copy_s = static_cast<double>(r.offloaded) * round_trip;
    std::printf("  %-9s %11s %5lld/%-3lld %12s %12s %11s %9.4f %10.4f %7.1f%% %9.4f %s\n",
                r.label.c_str(), r.host_budget ? format_bytes(*r.host_budget).c_str() : "-",
                static_cast<long long>(r.offloaded), static_cast<long long>(L),
                format_bytes(peak).c_str(), format_bytes(bound).c_str(), format_bytes(host).c_str(),
                t, t - t_standard, 100.0 * (t - t_standard) / t_standard, copy_s,
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
    json_rows.push_back(
        {{"schedule", r.checkpoint == CheckpointSchedule::standard ? "standard" : "sco"},
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
  const ScoRow& all = rows.back();
  std::printf(
      "# every layer offloaded: boundaries peak %s = %.3f of standard's %s (2 of L + 1 = %lld "
      "boundaries, the final hidden state counted in both)\n",
      format_bytes(all.device.peak_per_set()[LiveSet::boundaries]).c_str(),
      static_cast<double>(all.device.peak_per_set()[LiveSet::boundaries]) /
          static_cast<double>(rows.front().device.peak_per_set()[LiveSet::boundaries]),
      format_bytes(rows.front().device.peak_per_set()[LiveSet::boundaries]).c_str(),
      static_cast<long long>(L + 1));

  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"batch", B},
                            {"seq_len", T},
                            {"tokens", N},
                            {"hidden_size", H},
                            {"num_hidden_layers", L},
                            {"num_local_experts", m.num_local_experts},
                            {"num_experts_per_tok", m.num_experts_per_tok},
                            {"intermediate_size", m.intermediate_size},
                            {"vocab_size", m.vocab_size},
                            {"boundary_bytes", one},
                            {"round_trip_s", round_trip}};
    write_bench_json(args.common.json_path, "sco", 1, shape, json_rows);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    MOEPEAK_CHECK(rows[i].loss == rows.front().loss && errors[i] == 0, "bench sco: ", rows[i].label,
                  " is not bitwise equal to standard checkpointing");
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
  sco->callback([&ctx] { ctx.action = [&ctx] { return run_bench_sco(args, ctx); }; });
}

}  // namespace moepeak::cli
