// `moepeak plan [--config F]... [--set k=v]... [-n W] [--json FILE] [--max-context] [--max-batch]
//  [--svg FILE [--svg-range LO:HI]] [--search-layout [--all]]`:
// the closed-form per-rank memory plan of a config (core/plan/plan.h;
// docs/design.md#memory-accounting, paper eq. 6) — one row per live set with the function that gave
// it, the total against the device capacity, the pinned host terms against the host budget, and the
// verdict. Exit 0 when it fits, 3 when it does not (so scripts can branch on it), 1 for a bad
// config. `moepeak train` prints the same table and refuses to start (exit 2) when the plan does
// not fit, unless --force. --svg draws the stacked per-set budget against seq_len, all-standard and
// configured (core/plan/plan_svg.h). --search-layout ranks every layout of W ranks instead
// (core/plan/layout_search.h). Test: ctest -R test_plan_cli (tests/plan/test_plan_cli.sh).
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/measure/harness.h"
#include "core/measure/machine_measure.h"
#include "core/plan/layout_search.h"
#include "core/plan/machine_rates.h"
#include "core/plan/plan.h"
#include "core/plan/plan_svg.h"
#include "core/plan/step_time.h"
#include "core/units.h"
#include "topology/auto_budget.h"
#include "topology/probe_file.h"

namespace moepeak::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double pct(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

struct PlanArgs {
  ConfigArgs config;
  int world = 0;
  std::string json_path, svg_path, svg_range;
  bool max_context = false, max_batch = false, search_layout = false, all = false;
  bool time = false;
  std::string device;  // --device: h100, h200 or "" (this machine, measured)
};

// The step-time model's rates (core/plan/machine_rates.h), in this order: a device's defaults
// (--device); the probe file's [rates] (runtime.probe_file, `moepeak probe`) when they are the
// config's backend's and dtype's; else this machine's CPU backend measured at the config's shapes
// with one rank's share of the cores (W ranks on this host), its ranks' links from the link model.
// A probe file without usable rates is said on stdout (a `#` line) before the fallback.
MachineRates rates_for(const Config& cfg, const PlanInputs& in, const std::string& device) {
  if (!device.empty()) return device_rates(device, in.dtype);
  std::string unusable;
  if (!cfg.runtime.probe_file.empty()) {
    const std::string path = topology::resolve_probe_path(cfg.runtime.probe_file);
    const topology::ProbeResult probe = topology::read_probe_file(path);
    unusable = probe_rates_unusable(probe, path, cfg.runtime, in.dtype);
    if (unusable.empty()) return rates_from_probe(probe, path, cfg.runtime, in.dtype);
  }
  if (cfg.runtime.backend == BackendChoice::cuda) {
    MOEPEAK_INPUT_ERROR(
        "moepeak plan --time for runtime.backend = \"cuda\": name the GPU with "
        "--device h100 or --device h200 (its documented defaults), or point runtime.probe_file "
        "at a probe file with the GPU's rates (`moepeak probe -o FILE` on the node)",
        unusable.empty() ? "" : "; " + unusable);
  }
  if (!unusable.empty()) std::printf("# step time: %s; measuring this machine\n", unusable.c_str());
  // A rank's share of this host's cores, as W ranks of a CPU job on it run.
  RankInfo one_of_w;
  one_of_w.world_size = one_of_w.local_size = in.world();
  auto backend = Backend::create(measure::bench_backend_options(cfg, one_of_w));
  MachineRates r = measure::measure_machine_rates(*backend, cfg, in);
  set_cpu_links(r, cfg.runtime, in.world());
  return r;
}

void print_step_time(const StepTime& t, std::FILE* out) {
  std::fprintf(out, "# step time: %s (%s); W = %d ranks, %d per node\n", t.rates.name.c_str(),
               t.rates.source.c_str(), t.world, t.rates.ranks_per_node);
  std::fprintf(out, "# %-18s %9s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n", "phase", "gemm_s",
               "grouped_s", "attn_s", "elem_s", "optim_s", "launch_s", "comm_s", "exposed_s",
               "time_s", "bound");
  for (const PhaseTime& p : t.phases) {
    std::fprintf(out, "  %-18s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f  %s\n",
                 std::string(step_phase_name(p.phase)).c_str(), p.gemm_s, p.grouped_gemm_s,
                 p.attention_s, p.elementwise_s, p.optimizer_s, p.launch_s, p.comm_s,
                 p.exposed_comm_s, p.time_s(), p.bound.c_str());
  }
  std::fprintf(out,
               "# predicted step %.4f s, %.0f tokens/s, MFU %.1f%% (of a peak of %.1f GFLOP/s per "
               "rank)\n",
               t.step_s, t.tokens_per_s, 100.0 * t.mfu, t.rates.peak_flops / 1e9);
}

nlohmann::json step_time_json(const StepTime& t) {
  nlohmann::json phases = nlohmann::json::array();
  for (const PhaseTime& p : t.phases) {
    phases.push_back({{"phase", std::string(step_phase_name(p.phase))},
                      {"gemm_s", p.gemm_s},
                      {"grouped_gemm_s", p.grouped_gemm_s},
                      {"attention_s", p.attention_s},
                      {"elementwise_s", p.elementwise_s},
                      {"optimizer_s", p.optimizer_s},
                      {"launch_s", p.launch_s},
                      {"compute_s", p.compute_s()},
                      {"comm_s", p.comm_s},
                      {"exposed_comm_s", p.exposed_comm_s},
                      {"time_s", p.time_s()},
                      {"bound", p.bound}});
  }
  return {{"step_s", t.step_s},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"flops", t.flops},
          {"rates",
           {{"name", t.rates.name},
            {"source", t.rates.source},
            {"gemm_flops", t.rates.gemm_flops},
            {"grouped_gemm_flops", t.rates.grouped_gemm_flops},
            {"attention_flops", t.rates.attention_flops},
            {"memory_bytes_per_s", t.rates.memory_bytes_per_s},
            {"elementwise_bytes_per_s", t.rates.elementwise_bytes_per_s},
            {"loss_bytes_per_s", t.rates.loss_bytes_per_s},
            {"host_link_bytes_per_s", t.rates.host_link_bytes_per_s},
            {"host_memory_bytes_per_s", t.rates.host_memory_bytes_per_s},
            {"node_link_bytes_per_s", t.rates.node_link_bytes_per_s},
            {"network_bytes_per_s", t.rates.network_bytes_per_s},
            {"ranks_per_node", t.rates.ranks_per_node},
            {"peak_flops", t.rates.peak_flops},
            {"op_latency_s", t.rates.op_latency_s}}},
          {"phases", phases}};
}

struct Reach {
  int64_t configured = 0, standard = 0;
};

// The phases of the step (docs/plan.md#phases): each set's bytes in each, and the phase's total.
void print_phases(std::FILE* out, const Plan& p) {
  std::fprintf(out, "# %-18s", "phase");
  for (LiveSet s : kAllLiveSets) std::fprintf(out, " %10s", std::string(live_set_name(s)).c_str());
  std::fprintf(out, " %10s %8s\n", "total", "%cap");
  for (const PlanPhase& ph : p.phases) {
    std::fprintf(out, "  %-18s", std::string(step_phase_name(ph.phase)).c_str());
    for (LiveSet s : kAllLiveSets) std::fprintf(out, " %10s", format_bytes(ph[s]).c_str());
    std::fprintf(out, " %10s %7.2f%%%s\n", format_bytes(ph.total).c_str(),
                 pct(ph.total, p.inputs.capacity), ph.phase == p.peak_phase ? "  <- peak" : "");
  }
}

}  // namespace

void print_plan(const Plan& p, std::FILE* out) {
  const PlanInputs& in = p.inputs;
  std::fprintf(out,
               "# moepeak plan: per-rank device memory on W = %d rank%s (%s), batch %lld x seq_len "
               "%lld, N = %lld tokens per rank, %s\n",
               in.world(), in.world() == 1 ? "" : "s", in.degrees.str().c_str(),
               static_cast<long long>(in.batch), static_cast<long long>(in.seq_len),
               static_cast<long long>(p.tokens_per_rank),
               std::string(dtype_name(in.dtype)).c_str());
  if (in.grad_accum > 1) {
    std::fprintf(out,
                 "# grad_accum_steps %lld: every bound is per micro-batch (batch %lld); a step "
                 "trains on %lld sequences, its gradients summed in place in the shards\n",
                 static_cast<long long>(in.grad_accum), static_cast<long long>(in.batch),
                 static_cast<long long>(in.grad_accum * in.batch));
  }
  std::fprintf(out, "# capacity %s per rank, host (pinned) budget %s\n",
               format_bytes(in.capacity).c_str(), format_bytes(in.host_budget).c_str());
  std::fprintf(out,
               "# total = the step's largest phase, each the sum of the sets live in it "
               "(docs/plan.md#phases); sum of terms: every set at its own peak at once\n");
  // The schedule column is as wide as its longest entry (at least 17), so the columns stay fixed.
  int sw = 17;
  for (const PlanTerm& t : p.terms) sw = std::max(sw, static_cast<int>(t.schedule.size()));
  const int hw = 12 + sw;  // the host table's name column spans "live set" and "schedule"
  std::fprintf(out, "# %-11s %-*s %16s %10s %9s  %s\n", "live set", sw, "schedule", "bytes", "GiB",
               "%cap", "function");
  for (const PlanTerm& t : p.terms) {
    std::fprintf(out, "  %-11s %-*s %16llu %10.4f %8.2f%%  %s\n",
                 std::string(live_set_name(t.set)).c_str(), sw, t.schedule.c_str(),
                 static_cast<unsigned long long>(t.bytes), t.bytes / kGiB,
                 pct(t.bytes, in.capacity), t.function.c_str());
  }
  std::fprintf(out, "  %-11s %-*s %16llu %10.4f %8.2f%%\n", "sum of terms", sw - 1, "",
               static_cast<unsigned long long>(p.sum_of_terms), p.sum_of_terms / kGiB,
               pct(p.sum_of_terms, in.capacity));
  print_phases(out, p);
  std::fprintf(out, "  %-11s %-*s %16llu %10.4f %8.2f%%  %s\n", "allocator", sw, "fragmentation",
               static_cast<unsigned long long>(p.fragmentation), p.fragmentation / kGiB,
               pct(p.fragmentation, in.capacity),
               "DeviceArena::fragmentation_allowance(the peak phase beyond the setup's)");
  std::fprintf(out, "  %-11s %-*s %16llu %10.4f %8.2f%%  %s (%s)\n", "total", sw, "",
               static_cast<unsigned long long>(p.total), p.total / kGiB, pct(p.total, in.capacity),
               p.device_fits ? "fits" : "DOES NOT FIT",
               std::string(step_phase_name(p.peak_phase)).c_str());
  if (!p.outside.empty()) {
    // CUDA: beside the arena, not in its capacity (core/runtime/outside_arena.h).
    std::fprintf(out, "# outside the arena %-*s %16s %10s %9s  %s\n", hw - 19, "term", "bytes",
                 "GiB", "%cap", "basis");
    for (const OutsideArenaTerm& t : p.outside) {
      std::fprintf(out, "  %-*s %16llu %10.4f %8.2f%%  %s\n", hw, t.name.c_str(),
                   static_cast<unsigned long long>(t.bytes), t.bytes / kGiB,
                   pct(t.bytes, in.capacity), t.basis.c_str());
    }
    std::fprintf(out, "  %-*s %16llu %10.4f %8.2f%%  the GPU needs capacity + this\n", hw,
                 "outside total", static_cast<unsigned long long>(p.outside_total),
                 p.outside_total / kGiB, pct(p.outside_total, in.capacity));
  }
  std::fprintf(out, "# host (pinned) %-*s %16s %10s %9s  %s\n", hw - 15, "term", "bytes", "GiB",
               "%budget", "function");
  for (const HostTerm& h : p.host) {
    std::fprintf(out, "  %-*s %16llu %10.4f %8.2f%%  %s\n", hw, h.name.c_str(),
                 static_cast<unsigned long long>(h.bytes), h.bytes / kGiB,
                 pct(h.bytes, in.host_budget), h.function.c_str());
  }
  std::fprintf(out, "  %-*s %16llu %10.4f %8.2f%%  %s\n", hw, "host total",
               static_cast<unsigned long long>(p.host_total), p.host_total / kGiB,
               pct(p.host_total, in.host_budget), p.host_fits ? "fits" : "DOES NOT FIT");
  std::fprintf(out, "# verdict: %s\n", p.verdict().c_str());
}

namespace {

nlohmann::json plan_json(const Plan& p) {
  nlohmann::json sets = nlohmann::json::object(), functions = nlohmann::json::object(),
                 scheds = nlohmann::json::object(), host = nlohmann::json::object();
  for (const PlanTerm& t : p.terms) {
    const std::string name(live_set_name(t.set));
    sets[name] = t.bytes;
    functions[name] = t.function;
    scheds[name] = t.schedule;
  }
  for (const HostTerm& h : p.host) host[h.name] = h.bytes;
  nlohmann::json outside = nlohmann::json::object();
  for (const OutsideArenaTerm& t : p.outside) outside[t.name] = t.bytes;
  nlohmann::json phases = nlohmann::json::object();  // {"attention": {"total": .., sets..}, ..}
  for (const PlanPhase& ph : p.phases) {
    nlohmann::json j = {{"total", ph.total}};
    for (LiveSet s : kAllLiveSets) j[std::string(live_set_name(s))] = ph[s];
    phases[std::string(step_phase_name(ph.phase))] = j;
  }
  return {{"world_size", p.inputs.world()},
          {"expert_parallel", p.inputs.degrees.expert},
          {"sequence_parallel", p.inputs.degrees.sequence},
          {"data_shard", p.inputs.degrees.data_shard},
          {"batch", p.inputs.batch},
          {"grad_accum_steps", p.inputs.grad_accum},
          {"seq_len", p.inputs.seq_len},
          {"tokens_per_rank", p.tokens_per_rank},
          {"dtype", std::string(dtype_name(p.inputs.dtype))},
          {"live_sets", sets},
          {"functions", functions},
          {"schedules", scheds},
          {"total_bytes", p.total},
          {"peak_phase", std::string(step_phase_name(p.peak_phase))},
          {"phase_bytes", phases},
          {"sum_of_terms_bytes", p.sum_of_terms},
          {"fragmentation_bytes", p.fragmentation},
          {"capacity_bytes", p.inputs.capacity},
          {"outside_arena", outside},
          {"outside_arena_bytes", p.outside_total},
          {"group_communicators", p.communicators},
          {"host_terms", host},
          {"host_bytes", p.host_total},
          {"host_budget_bytes", p.inputs.host_budget},
          {"sco_offloaded_layers", p.sco_offloaded_layers},
          {"device_fits", p.device_fits},
          {"host_fits", p.host_fits},
          {"fits", p.fits()},
          {"overflow", p.overflow()},
          {"verdict", p.verdict()}};
}

// The --svg picture: one make_plan per power-of-two seq_len in the range ("LO:HI", default from
// 1024 to the power of two past the larger max context, at most 2^24), all-standard and configured.
std::string svg_of(const Config& cfg, const PlanInputs& in, const std::string& range) {
  int64_t lo = 1024, hi = 0;
  if (!range.empty()) {
    const auto colon = range.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument(range);
      lo = std::stoll(range.substr(0, colon));
      hi = std::stoll(range.substr(colon + 1));
    } catch (const std::exception&) {
      MOEPEAK_INPUT_ERROR("--svg-range ", range, ": expected LO:HI, two token counts");
    }
    if (lo < 1 || hi < lo) MOEPEAK_INPUT_ERROR("--svg-range ", range, ": needs 1 <= LO <= HI");
  } else {
    const int64_t reach =
        std::max(max_seq_len(cfg, in), max_seq_len(with_standard_schedules(cfg), in));
    hi = 2048;
    while (hi <= reach && hi < (int64_t{1} << 24)) hi *= 2;
  }
  std::vector<PlanSeries> series{{"all standard", {}}, {"configured schedules", {}}};
  const Config standard = with_standard_schedules(cfg);
  for (int64_t T : svg_seq_lens(lo, hi, in.degrees.sequence)) {
    PlanInputs at = in;
    at.seq_len = T;
    try {
      Plan ps = make_plan(standard, at), pc = make_plan(cfg, at);
      series[0].plans.push_back(std::move(ps));
      series[1].plans.push_back(std::move(pc));
    } catch (const Error&) {  // a layout that cannot split this T: no bar
    }
  }
  if (series[1].plans.empty())
    MOEPEAK_INPUT_ERROR("--svg: no seq_len in ", lo, ":", hi,
                        " can be laid out on W = ", in.world());
  return plan_svg(series, cfg.job.name + " on W = " + std::to_string(in.world()) +
                              " ranks, batch " + std::to_string(in.batch) + ", " +
                              std::string(dtype_name(in.dtype)));
}

// What every layout of a kind that cannot exist has in common (LayoutRow::defect), for the line
// that folds them; other: make_plan rejected it (each such row is listed, its message the reason).
const char* defect_summary(LayoutDefect d) {
  switch (d) {
    case LayoutDefect::experts:
      return "the experts do not split over Ep";
    case LayoutDefect::batch:
      return "the global batch does not split over the W/Sp sequence groups";
    case LayoutDefect::query_heads:
      return "the query heads do not split over Sp";
    case LayoutDefect::seq_len:
      return "seq_len does not split over Sp";
    case LayoutDefect::kv_group:
      return "the query heads are not a multiple of the kv heads";
    case LayoutDefect::kv_heads:
      return "neither of the kv heads and Sp divides the other";
    case LayoutDefect::none:
    case LayoutDefect::other:
      break;
  }
  return "the plan rejects the layout";
}

// The layout search's table: one row per layout that can exist (fit or not), the best marked;
// then those that cannot, one line per kind of reason with their count and the first as an example
// (`all`: each as a row, where it falls); then the best as --set lines. `timed`: the search went
// through order_layouts_by_step_time (rows fastest first, a step_s column). The JSON has every row.
int print_layout_search(const LayoutSearch& s, const PlanInputs& in, nlohmann::json& j, bool timed,
                        bool all) {
  const char* goal = s.goal == LayoutGoal::max_context ? "the longest seq_len"
                     : s.goal == LayoutGoal::max_batch ? "the largest micro-batch"
                                                       : "fits at the configured shape";
  std::printf(
      "# moepeak plan --search-layout: W = %d ranks, global batch %lld x seq_len %lld, %s; best: "
      "%s\n",
      in.world(), static_cast<long long>(s.global_batch), static_cast<long long>(in.seq_len),
      std::string(dtype_name(in.dtype)).c_str(),
      timed ? "the shortest predicted step that fits (--time)"
            : (std::string(goal) + ", then the fewest bytes per step").c_str());
  std::printf(
      "# bytes per step: what one rank sends in a step (docs/parallelism.md#bytes-per-step)\n");
  std::printf("# %4s %4s %4s %6s %6s  %-13s %-10s %10s %10s %10s %12s%s\n", "Ep", "Sp", "Ds",
              "batch", "accum", "verdict", "binding", "peak GiB", "max ctx", "max batch", "GB/step",
              timed ? "     step_s" : "");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const LayoutRow& r = s.rows[i];
    const ParallelDegrees& d = r.degrees;
    nlohmann::json jr = {{"expert_parallel", d.expert},
                         {"sequence_parallel", d.sequence},
                         {"data_shard", d.data_shard},
                         {"valid", r.valid}};
    if (!r.valid) {
      // A reason whose kind is not known (other) is its own kind: listed, not folded.
      if (all || r.defect == LayoutDefect::other) {
        std::printf("  %4d %4d %4d %6s %6s  %-13s %s\n", d.expert, d.sequence, d.data_shard, "-",
                    "-", "invalid", r.why.c_str());
      }
      jr["defect"] = std::string(layout_defect_name(r.defect));
      jr["why"] = r.why;
      rows.push_back(jr);
      continue;
    }
    const char* verdict = r.plan.fits() ? "fits" : "does not fit";
    std::printf("%s %4d %4d %4d %6lld %6lld  %-13s %-10s %10.2f %10lld %10lld %12.3f",
                static_cast<int>(i) == s.best ? "*" : " ", d.expert, d.sequence, d.data_shard,
                static_cast<long long>(r.batch), static_cast<long long>(r.grad_accum), verdict,
                r.binding.c_str(), static_cast<double>(r.plan.total) / kGiB,
                static_cast<long long>(r.max_context), static_cast<long long>(r.max_batch),
                r.traffic.total() / 1e9);
    if (timed && r.step_s > 0) {
      std::printf(" %10.4f", r.step_s);
      jr["step_s"] = r.step_s;
    } else if (timed) {
      std::printf(" %10s", "-");
    }
    std::printf("\n");
    jr.update({{"batch", r.batch},
               {"grad_accum_steps", r.grad_accum},
               {"fits", r.plan.fits()},
               {"binding", r.binding},
               {"total_bytes", r.plan.total},
               {"max_context", r.max_context},
               {"max_batch", r.max_batch},
               {"bytes_per_step",
                {{"total", r.traffic.total()},
                 {"zero_dense", r.traffic.zero_dense},
                 {"dense_replicas", r.traffic.dense_replicas},
                 {"zero_experts", r.traffic.zero_experts},
                 {"ulysses", r.traffic.ulysses},
                 {"dispatch", r.traffic.dispatch},
                 {"vocab", r.traffic.vocab}}}});
    rows.push_back(jr);
  }
  j["layouts"] = rows;
  if (!all) {
    // The folded lines: per kind, in the order the kinds first appear.
    std::vector<LayoutDefect> kinds;
    std::vector<const LayoutRow*> first;
    std::vector<int> count;
    for (const LayoutRow& r : s.rows) {
      if (r.valid || r.defect == LayoutDefect::other) continue;
      const auto at = std::find(kinds.begin(), kinds.end(), r.defect);
      if (at == kinds.end()) {
        kinds.push_back(r.defect);
        first.push_back(&r);
        count.push_back(1);
      } else {
        ++count[static_cast<size_t>(at - kinds.begin())];
      }
    }
    for (size_t k = 0; k < kinds.size(); ++k) {
      const ParallelDegrees& d = first[k]->degrees;
      std::printf("# %d layout%s cannot exist: %s (e.g. Ep=%d Sp=%d Ds=%d: %s)\n", count[k],
                  count[k] == 1 ? "" : "s", defect_summary(kinds[k]), d.expert, d.sequence,
                  d.data_shard, first[k]->why.c_str());
    }
    if (!kinds.empty()) std::printf("# (--all lists each layout that cannot exist)\n");
  }
  if (s.best < 0) {
    std::printf("# best layout: none fits\n");
    j["best"] = nullptr;
    return 3;
  }
  const LayoutRow& b = s.rows[static_cast<size_t>(s.best)];
  std::printf(
      "# best layout: --set parallelism.expert_parallel=%d --set parallelism.sequence_parallel=%d "
      "--set parallelism.data_shard=%d --set training.batch_size=%lld --set "
      "training.grad_accum_steps=%lld\n",
      b.degrees.expert, b.degrees.sequence, b.degrees.data_shard, static_cast<long long>(b.batch),
      static_cast<long long>(b.grad_accum));
  j["best"] = {{"expert_parallel", b.degrees.expert},
               {"sequence_parallel", b.degrees.sequence},
               {"data_shard", b.degrees.data_shard},
               {"batch", b.batch},
               {"grad_accum_steps", b.grad_accum}};
  return 0;
}

int run_plan(const PlanArgs& args, const Context& ctx) {
  const Config cfg = load_config_for_command(args.config, ctx);
  if (args.search_layout) {
    // The configured degrees need not divide the searched W: only the other inputs count.
    Config any = cfg;
    any.parallelism.expert_parallel = any.parallelism.sequence_parallel =
        any.parallelism.data_shard = 0;
    const PlanInputs in = plan_inputs(any, args.world);
    const LayoutGoal goal = args.max_context ? LayoutGoal::max_context
                            : args.max_batch ? LayoutGoal::max_batch
                                             : LayoutGoal::fits;
    nlohmann::json j;
    LayoutSearch search = search_layouts(any, in, goal);
    if (args.time) order_layouts_by_step_time(any, search, rates_for(any, in, args.device));
    const int rc = print_layout_search(search, in, j, args.time, args.all);
    if (!args.json_path.empty()) write_file_atomically(args.json_path, j.dump(2) + "\n");
    return rc;
  }
  const PlanInputs in = plan_inputs(cfg, args.world);
  const Plan p = make_plan(cfg, in);
  print_plan(p, stdout);
  nlohmann::json j = plan_json(p);
  // The search: the same make_plan over seq_len (multiples of W) or batch, for the configured
  // schedules and for the all-standard ones.
  if (args.max_context) {
    const Reach r{max_seq_len(cfg, in), max_seq_len(with_standard_schedules(cfg), in)};
    std::printf(
        "# max context (seq_len, batch %lld): configured schedules %lld, all standard %lld\n",
        static_cast<long long>(in.batch), static_cast<long long>(r.configured),
        static_cast<long long>(r.standard));
    j["max_context"] = {{"configured", r.configured}, {"standard", r.standard}};
  }
  if (args.max_batch) {
    const Reach r{max_batch(cfg, in), max_batch(with_standard_schedules(cfg), in)};
    std::printf("# max batch (seq_len %lld): configured schedules %lld, all standard %lld\n",
                static_cast<long long>(in.seq_len), static_cast<long long>(r.configured),
                static_cast<long long>(r.standard));
    j["max_batch"] = {{"configured", r.configured}, {"standard", r.standard}};
  }
  if (args.time) {
    const StepTime t = predict_step_time(cfg, p, rates_for(cfg, in, args.device));
    print_step_time(t, stdout);
    j["time"] = step_time_json(t);
  }
  if (!args.svg_path.empty()) write_file_atomically(args.svg_path, svg_of(cfg, in, args.svg_range));
  if (!args.json_path.empty()) write_file_atomically(args.json_path, j.dump(2) + "\n");
  return p.fits() ? 0 : 3;
}

}  // namespace

void register_plan_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "plan",
      "per-rank memory plan of a config: each live set's bytes, the total against the "
      "capacity, host memory, and whether it fits (exit 3 when it does not)");
  static PlanArgs args;
  add_config_options(*cmd, args.config);
  cmd->add_option("-n,--world-size", args.world,
                  "ranks W to plan for (default: parallelism.world_size, or 1 when that is 0)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--json", args.json_path,
                  "also write the plan as JSON (docs/design.md#machine-readable-outputs)");
  cmd->add_option("--svg", args.svg_path,
                  "also draw the stacked per-live-set budget against seq_len (all standard vs "
                  "configured) as SVG");
  cmd->add_option("--svg-range", args.svg_range,
                  "LO:HI: the seq_len range of --svg (powers of two; "
                  "default 1024 to past the max context)");
  cmd->add_flag("--max-context", args.max_context,
                "find the largest seq_len that fits, configured and all-standard schedules");
  cmd->add_flag("--max-batch", args.max_batch,
                "find the largest batch_size that fits, configured and all-standard schedules");
  cmd->add_flag("--search-layout", args.search_layout,
                "enumerate every (expert_parallel, sequence_parallel, data_shard) for W ranks, "
                "each with the micro-batch and grad_accum_steps of the config's global batch, and "
                "name the best (with --max-context or --max-batch: by that reach)");
  cmd->add_flag("--all", args.all,
                "with --search-layout, list each layout that cannot exist with its reason "
                "(default: one line per kind of reason, with a count)");
  cmd->add_flag("--time", args.time,
                "also predict the step time per phase (docs/plan.md#step-time): compute, "
                "communication and what the schedules hide; with --search-layout, order the "
                "layouts that fit by it");
  cmd->add_option("--device", args.device,
                  "the rates --time prices with: h100 or h200 (documented defaults); default: "
                  "the [rates] of runtime.probe_file (`moepeak probe`) when they are the config's "
                  "backend's and dtype's, else this machine's CPU backend, measured at the "
                  "config's shapes")
      ->check(CLI::IsMember({"h100", "h200"}));
  cmd->callback([&ctx] {
    if (!args.device.empty() && !args.time) {
      throw CLI::ValidationError("--device", "is the rates of --time; add --time");
    }
    if (args.all && !args.search_layout) {
      throw CLI::ValidationError("--all", "lists the layouts of --search-layout; add it");
    }
    if (args.search_layout && args.max_context && args.max_batch) {
      throw CLI::ValidationError("--search-layout", "takes --max-context or --max-batch, not both");
    }
    ctx.action = [&ctx] { return run_plan(args, ctx); };
  });
}

}  // namespace moepeak::cli
