// `moepeak probe`: run on each node before training — what the node has (packages, NUMA nodes,
// cores, PCI GPUs and NICs with their NUMA node, CUDA devices, peer access, NVLinks, versions),
// how fast its host link is, how much pinned host memory each local rank may take for SCO and
// the optimizer, and the step-time model's rates of one rank (core/measure/machine_measure.h at
// a config's shapes, on the GPU when there is one, else on the CPU backend with one rank's share
// of the cores). Prints `#`-commented fixed-column tables (nccl-tests style); --output writes the
// probe file that runtime.probe_file points plan/train/tune at; --json the same as JSON.
//
//   moepeak probe [--ranks-per-node N] [--output probe.toml] [--json probe.json]
//                 [--no-bench | --bench-bytes 256MiB --iters 5] [--topology-xml FILE]
//                 [--cpu] [--optimizer-share 0.75] [-c config.toml]... [--set key=value]...
//
// --topology-xml reads an hwloc XML export (lstopo --of xml) instead of this machine and skips
// the measurements (as does --no-bench). -c/--set: the config whose shapes and dtype the rates
// are measured at (default the embedded one). docs/probe.md has the formula, the file format and
// measured figures.
// Test: ctest -R test_probe_cli.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli/bench_common.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/measure/machine_measure.h"
#include "core/plan/plan.h"
#include "core/plan/step_time.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "topology/host_budget.h"
#include "topology/host_link_bench.h"
#include "topology/node_topology.h"
#include "topology/probe_file.h"

namespace moepeak::cli {
namespace {

using namespace moepeak::topology;

struct ProbeArgs {
  ConfigArgs config;  // the shapes and dtype of the step-time rates
  std::string topology_xml;
  int ranks_per_node = 0;  // 0: one per GPU, else one per NUMA node
  std::string output;
  std::string json_path;
  bool no_bench = false;
  std::string bench_bytes = "256MiB";
  int iters = 5;
  bool cpu = false;
  double optimizer_share = BudgetPolicy{}.optimizer_share;
};

const char* or_dash(const std::string& s) { return s.empty() ? "-" : s.c_str(); }
std::string node_text(int n) { return n < 0 ? "?" : std::to_string(n); }

const char* not_measured_why(const ProbeArgs& a) {
  return a.topology_xml.empty() ? "--no-bench" : "--topology-xml";
}

// The step-time rates as a table: each in the unit people read it in, and its key in the file.
void print_rates(const ProbeResult& r, const ProbeArgs& a) {
  if (!r.rates_measured) {
    std::printf("#\n# Step-time rates: not measured (%s)\n", not_measured_why(a));
    return;
  }
  const ProbeRates& x = r.rates;
  std::printf(
      "#\n# Step-time rates (docs/plan.md#step-time): %s, %s, one rank of %d on the node; median "
      "of 3 after one warm-up\n",
      x.backend.c_str(), x.dtype.c_str(), x.ranks_sharing);
  std::printf("# device: %s\n# shapes: %s\n", x.device.c_str(), x.shapes.c_str());
  std::printf("# %-12s %12s %-8s %s\n", "rate", "value", "unit", "key");
  for (const ProbeRateField& f : kProbeRateFields)
    std::printf("  %-12s %12.3f %-8s %s\n", f.label, x.*f.member / f.scale, f.unit, f.key);
}

void print_tables(const ProbeResult& r, const ProbeArgs& a) {
  const NodeTopology& t = r.topology;
  std::printf("# moepeak probe: host %s, %s, moepeak %s\n", r.host.c_str(), r.date.c_str(),
              r.moepeak.c_str());
  std::printf("# source: %s; %zu package%s, %zu NUMA node%s, %d cores, %d PUs, %s\n",
              t.source.c_str(), t.packages.size(), t.packages.size() == 1 ? "" : "s",
              t.numa_nodes.size(), t.numa_nodes.size() == 1 ? "" : "s", t.cores, t.pus,
              format_bytes(t.memory_bytes()).c_str());
  for (const auto& p : t.packages) {
    std::printf("# package %d: %s, %d cores, %d PUs\n", p.os_index, or_dash(p.cpu_model), p.cores,
                p.pus);
  }
  std::printf("# GPUs: %s; CUDA driver %s, runtime %s; NCCL %s; NVML %s\n", t.gpu_status.c_str(),
              or_dash(t.cuda_driver), or_dash(t.cuda_runtime), or_dash(t.nccl), or_dash(t.nvml));

  std::printf("#\n# NUMA nodes\n# %4s %7s %12s %6s %5s  %s\n", "node", "package", "memory", "cores",
              "pus", "cpus");
  for (const auto& n : t.numa_nodes) {
    std::printf("  %4d %7s %12s %6d %5d  %s\n", n.os_index, node_text(n.package).c_str(),
                format_bytes(n.memory_bytes).c_str(), n.cores, n.pus, or_dash(n.cpus));
  }

  std::printf("#\n# PCI GPUs and NICs (hwloc)\n# %-4s %-13s %5s %-9s %4s  %s\n", "kind", "bus_id",
              "class", "vendor:id", "numa", "os devices");
  auto pci_row = [](const PciDeviceInfo& d) {
    std::printf("  %-4s %-13s  %04x %04x:%04x %4s  %s\n", pci_kind_name(d.kind), d.bus_id.c_str(),
                d.class_id, d.vendor_id, d.device_id, node_text(d.numa_node).c_str(),
                or_dash(d.os_names));
  };
  for (const auto& d : t.pci_gpus) pci_row(d);
  for (const auto& d : t.nics) pci_row(d);
  if (t.pci_gpus.empty() && t.nics.empty()) std::printf("  (none)\n");

  if (!t.gpus.empty()) {
    std::printf("#\n# CUDA devices\n# %3s %-24s %12s %4s %-13s %4s %7s\n", "gpu", "name", "memory",
                "cc", "bus_id", "numa", "nvlinks");
    for (const auto& g : t.gpus) {
      std::printf("  %3d %-24s %12s %2d.%d %-13s %4s %7s\n", g.index, g.name.c_str(),
                  format_bytes(g.memory_bytes).c_str(), g.cc_major, g.cc_minor, g.bus_id.c_str(),
                  node_text(g.numa_node).c_str(),
                  g.nvlinks < 0 ? "-" : std::to_string(g.nvlinks).c_str());
    }
    if (!t.gpu_links.empty()) {
      std::printf("#\n# GPU pairs\n# %3s %3s %5s %9s %7s\n", "a", "b", "peer", "perf_rank",
                  "nvlinks");
      for (const auto& l : t.gpu_links) {
        std::printf("  %3d %3d %5s %9s %7s\n", l.a, l.b, l.peer_access ? "yes" : "no",
                    l.perf_rank < 0 ? "-" : std::to_string(l.perf_rank).c_str(),
                    l.nvlinks < 0 ? "-" : std::to_string(l.nvlinks).c_str());
      }
    }
  }

  if (r.bench_run) {
    const HostLinkBench& h = r.bench;
    std::printf(
        "#\n# Host link: %s buffers, median (memcpy) / mean (GPU) of %d after one warm-up; GB/s = "
        "1e9 B/s\n",
        format_bytes(h.bytes).c_str(), h.iters);
    std::printf("# %-6s %-8s %3s %4s %5s %10s\n", "kind", "memory", "gpu", "numa", "local", "GB/s");
    for (const auto& row : h.rows) {
      std::printf("  %-6s %-8s %3s %4d %5s %10.3f\n", row.kind.c_str(), row.memory.c_str(),
                  row.gpu < 0 ? "-" : std::to_string(row.gpu).c_str(), row.numa_node,
                  row.local ? "yes" : "no", row.gb_per_s);
    }
    const PinningCost& p = h.pinning;
    std::printf(
        "# pinning %s on node %d: alloc + first touch %.3f s, mlock %s, cudaHostRegister %s\n",
        format_bytes(p.bytes).c_str(), p.numa_node, p.alloc_touch_s,
        p.mlock_ok ? (std::to_string(p.mlock_s).substr(0, 5) + " s").c_str() : "refused",
        p.cuda_register_s < 0 ? "-"
                              : (std::to_string(p.cuda_register_s).substr(0, 5) + " s").c_str());
    for (const auto& n : h.notes) std::printf("# note: %s\n", n.c_str());
  } else {
    std::printf("#\n# Host link: not measured (%s)\n", not_measured_why(a));
  }

  print_rates(r, a);

  const HostBudgets& b = r.budgets;
  std::printf(
      "#\n# Host budgets: %d rank%s per node; per NUMA node reserve max(%s, %.0f%% of memory), per "
      "rank %s%s;"
      " optimizer share %.2f\n",
      b.ranks_per_node, b.ranks_per_node == 1 ? "" : "s",
      format_bytes(b.policy.node_reserve_min_bytes).c_str(), 100 * b.policy.node_reserve_fraction,
      format_bytes(b.policy.rank_reserve_bytes).c_str(),
      t.gpu_count() == 0
          ? (" + CPU arena " + format_bytes(b.policy.cpu_device_memory_bytes)).c_str()
          : "",
      b.policy.optimizer_share);
  std::printf("# %4s %12s %5s %12s %12s %12s\n", "node", "memory", "ranks", "reserve",
              "rank_reserve", "usable");
  for (const auto& n : b.nodes) {
    std::printf("  %4d %12s %5d %12s %12s %12s\n", n.numa_node,
                format_bytes(n.memory_bytes).c_str(), n.ranks,
                format_bytes(n.reserve_bytes).c_str(), format_bytes(n.rank_reserve_bytes).c_str(),
                format_bytes(n.usable_bytes).c_str());
  }
  std::printf("# %4s %3s %4s %-9s %12s %12s %12s\n", "rank", "gpu", "numa", "cpus", "host_budget",
              "optimizer", "sco");
  for (const auto& k : b.ranks) {
    std::printf("  %4d %3s %4d %-9s %12s %12s %12s\n", k.place.local_rank,
                k.place.gpu < 0 ? "-" : std::to_string(k.place.gpu).c_str(), k.place.numa_node,
                or_dash(k.place.cpus), format_bytes(k.host_budget_bytes).c_str(),
                format_bytes(k.optimizer_budget_bytes).c_str(),
                format_bytes(k.sco_budget_bytes).c_str());
  }
  if (!a.output.empty()) std::printf("# probe file: %s (runtime.probe_file)\n", a.output.c_str());
  if (!a.json_path.empty()) std::printf("# json: %s\n", a.json_path.c_str());
}

// "hidden 64, seq 128 x batch 4 on W = 1 (512 tokens a rank), experts 4/2, vocab 256, from the
// embedded default --set training.seq_len=128": what the rates were measured at.
std::string shapes_text(const Config& cfg, const PlanInputs& in, const ConfigArgs& from) {
  const ModelConfig& m = cfg.model;
  std::string text =
      "hidden " + std::to_string(m.hidden_size) + ", seq " + std::to_string(in.seq_len) +
      " x batch " + std::to_string(in.batch) + " on W = " + std::to_string(in.world()) + " (" +
      std::to_string(in.batch * in.seq_len / in.world()) + " tokens a rank), experts " +
      std::to_string(m.num_local_experts) + "/" + std::to_string(m.num_experts_per_tok) +
      ", vocab " + std::to_string(m.vocab_size) + ", from ";
  if (from.files.empty()) text += "the embedded default";
  for (size_t i = 0; i < from.files.size(); ++i) text += (i ? " + " : "") + from.files[i];
  for (const std::string& o : from.overrides) text += " --set " + o;
  return text;
}

// The step-time model's rates of one of the node's ranks, at the config's shapes (its own W:
// parallelism.world_size, else 1) and dtype: on GPU 0 when the probe kept GPUs (not --cpu), else
// on the CPU backend with one rank's share of the cores (ranks_per_node ranks on this host).
ProbeRates measure_rates(const Config& loaded, const ProbeResult& r, const ConfigArgs& from) {
  const bool cuda = !r.topology.gpus.empty();
  Config cfg = loaded;
  cfg.runtime.backend = cuda ? BackendChoice::cuda : BackendChoice::cpu;
  cfg.runtime.probe_file.clear();  // plan_inputs' pinned budget: not from the file being written
  if (cuda && !cfg.runtime.device_memory_bytes()) {
    // "auto": plan_inputs wants a capacity, which the measurement does not use.
    cfg.runtime.device_memory = std::to_string(r.topology.gpus.front().memory_bytes);
  }
  const PlanInputs in = plan_inputs(cfg, 0);
  RankInfo one_of_n;
  one_of_n.world_size = one_of_n.local_size = r.budgets.ranks_per_node;
  BackendOptions options = measure::bench_any_backend_options(cfg, one_of_n);
  // NOTES: on a GPU the probe measures the device, not the config's arena: the card's free
  // memory (0 = auto), so that large shapes' operands fit.
  if (cuda) options.device_memory = 0;
  auto backend = Backend::create(options);
  const MachineRates m = measure::measure_machine_rates(*backend, cfg, in, 3);

  ProbeRates x;
  x.backend = cuda ? "cuda" : "cpu";
  x.device = cuda ? r.topology.gpus.front().name : backend->describe();
  x.dtype = std::string(dtype_name(in.dtype));
  x.ranks_sharing = r.budgets.ranks_per_node;
  x.shapes = shapes_text(cfg, in, from);
  x.gemm_flops = m.gemm_flops;
  x.grouped_gemm_flops = m.grouped_gemm_flops;
  x.attention_flops = m.attention_flops;
  x.memory_bytes_per_s = m.memory_bytes_per_s;
  x.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
  x.loss_bytes_per_s = m.loss_bytes_per_s;
  x.host_link_bytes_per_s = m.host_link_bytes_per_s;
  x.host_memory_bytes_per_s = m.host_memory_bytes_per_s;
  x.op_latency_s = m.op_latency_s;
  x.peak_flops = m.peak_flops;
  if (cuda && r.bench_run) {
    // The host link of a GPU is its pinned copies from its local node (the slower way), which the
    // host-link bench has just measured; machine_measure's memcpy is the CPU's.
    double link = 0;
    for (const BandwidthRow& row : r.bench.rows) {
      if (row.gpu != 0 || !row.local || row.memory != "pinned" || row.gb_per_s <= 0) continue;
      if (row.kind != "h2d" && row.kind != "d2h") continue;
      link = link > 0 ? std::min(link, row.gb_per_s * 1e9) : row.gb_per_s * 1e9;
    }
    if (link > 0) x.host_link_bytes_per_s = link;
  }
  return x;
}

int run_probe(const ProbeArgs& a, const Context& ctx) {
  const bool measure = !a.no_bench && a.topology_xml.empty();
  // The config first: a bad one fails before the measurements.
  const Config cfg = measure ? load_config_for_command(a.config, ctx) : Config{};
  const BuildInfo& bi = build_info();
  ProbeResult r;
  r.host = process_host();
  r.date = now_utc();
  r.moepeak = bi.version + " (git " + bi.git_sha + ")";
  r.topology = a.topology_xml.empty() ? load_this_machine() : load_topology_xml(a.topology_xml);
  if (a.cpu) {  // ranks run on the CPU backend: the GPUs are not theirs
    r.topology.gpus.clear();
    r.topology.gpu_links.clear();
    r.topology.pci_gpus.clear();
    r.topology.gpu_status = "ignored (--cpu): " + r.topology.gpu_status;
  }
  BudgetPolicy policy;
  policy.optimizer_share = a.optimizer_share;
  const int ranks = a.ranks_per_node > 0 ? a.ranks_per_node : default_ranks_per_node(r.topology);
  r.budgets = compute_host_budgets(r.topology, ranks, policy);
  if (measure) {
    auto bytes = parse_bytes(a.bench_bytes);
    if (!bytes || *bytes < 4096)
      MOEPEAK_INPUT_ERROR(
          "--bench-bytes must be a size of at least 4KiB such as \"256MiB\", got \"", a.bench_bytes,
          "\"");
    r.bench = run_host_link_bench(r.topology, BenchOptions{*bytes, a.iters});
    r.bench_run = true;
    r.rates = measure_rates(cfg, r, a.config);
    r.rates_measured = true;
  }
  if (!a.json_path.empty()) {
    write_file_atomically(a.json_path, probe_to_json(r).dump(2) + "\n");
  }
  if (!a.output.empty()) write_probe_file(a.output, r);
  print_tables(r, a);
  return 0;
}

}  // namespace

void register_probe_command(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("probe",
                                 "on each node before training: topology, host-link bandwidth, "
                                 "the step-time rates at a config's shapes (-c/--set), per-rank "
                                 "host budgets (the probe file for runtime.probe_file)");
  static ProbeArgs args;
  sub->add_option(
      "--topology-xml", args.topology_xml,
      "read an hwloc XML export (lstopo --of xml) instead of this machine; no bandwidth runs");
  sub->add_option("-n,--ranks-per-node", args.ranks_per_node,
                  "ranks that will run on this node (default: one per GPU, else one per NUMA node)")
      ->check(CLI::PositiveNumber);
  sub->add_option("-o,--output", args.output, "write the probe file (TOML) here, atomically");
  sub->add_option("--json", args.json_path, "write the probe as JSON here");
  auto* no_bench = sub->add_flag(
      "--no-bench", args.no_bench,
      "skip the measurements: bandwidth, pinning and the step-time rates (no [rates])");
  sub->add_option("--bench-bytes", args.bench_bytes,
                  "buffer size of each measurement (default 256MiB)")
      ->excludes(no_bench);
  sub->add_option("--iters", args.iters, "timed repetitions of each measurement (default 5)")
      ->check(CLI::PositiveNumber)
      ->excludes(no_bench);
  sub->add_flag("--cpu", args.cpu, "budgets for ranks on the CPU backend: ignore the GPUs");
  add_config_options(*sub, args.config);
  sub->add_option("--optimizer-share", args.optimizer_share,
                  "share of each rank's host budget for the optimizer state; SCO gets the rest "
                  "(default 0.75)")
      ->check(CLI::Range(0.0, 1.0));
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_probe(args, ctx); }; });
}

}  // namespace moepeak::cli
