// The probe file: round trip (TOML and JSON, with and without the step-time [rates]), atomic
// writes, clear errors (file:line and key) for unreadable, malformed and inconsistent files and a
// bad [rates] table, and the "auto" host-budget hook
// (topology/auto_budget.h) reading it for a rank.
// Run: ctest -R test_probe_file
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/config/config.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"
#include "tests/topology/topology_data.h"
#include "topology/auto_budget.h"
#include "topology/probe_file.h"

namespace moepeak::topology {
namespace {

using test_support::TempDir;
using test_support::topology_data;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A probe of the 2 x 4 GPU topology with CUDA devices, links and bench rows filled in by hand,
// so that every table and key of the format is written and read back.
ProbeResult full_probe() {
  ProbeResult r;
  r.host = "node07";
  r.date = "2026-11-30 10:00:00 UTC";
  r.moepeak = "0.1.0 (git abc \"quoted\")";
  r.topology = load_topology_xml(topology_data("2pkg_4gpu.xml"));
  for (int i = 0; i < 8; ++i) {
    GpuInfo g;
    g.index = i;
    g.name = "NVIDIA H100 80GB HBM3";
    g.memory_bytes = 85'024'112'640ull;
    g.cc_major = 9;
    g.bus_id = r.topology.pci_gpus[i].bus_id;
    g.numa_node = r.topology.pci_gpus[i].numa_node;
    g.nvlinks = 18;
    r.topology.gpus.push_back(g);
  }
  r.topology.gpu_links.push_back({0, 1, true, 0, 0});
  r.topology.gpu_links.push_back({0, 7, false, -1, -1});
  r.topology.cuda_driver = "13.0";
  r.topology.cuda_runtime = "13.0";
  r.topology.nccl = "2.28.9";
  r.topology.nvml = "580.95.05";
  r.budgets = compute_host_budgets(r.topology, 8);
  r.bench_run = true;
  r.bench.bytes = 256 * MiB;
  r.bench.iters = 5;
  r.bench.notes = {"a note with \\ and \"quotes\""};
  r.bench.rows.push_back({"memcpy", "pinned", -1, 0, true, 256 * MiB, 12.345678901234});
  r.bench.rows.push_back({"h2d", "pinned", 3, 1, false, 256 * MiB, 0.1});
  r.bench.rows.push_back({"bidir", "pageable", 7, 1, true, 256 * MiB, 87.9});
  r.bench.pinning = {0, 256 * MiB, 0.0812, 0.0123, true, 0.31};
  r.rates_measured = true;
  r.rates.backend = "cuda";
  r.rates.device = "NVIDIA H100 80GB \"HBM3\"";
  r.rates.dtype = "bf16";
  r.rates.ranks_sharing = 8;
  r.rates.shapes = "hidden 4096, seq 4096 x batch 1 on W = 8, from configs/mixtral-8x7b.toml";
  // Rates with long mantissas and tiny or huge exponents: the shortest text must read back
  // bit for bit.
  r.rates.gemm_flops = 6.9230000000000012e14;
  r.rates.grouped_gemm_flops = 5.4395e14 / 3;
  r.rates.attention_flops = 4.945e14 + 0.1;
  r.rates.memory_bytes_per_s = 2.8475e12;
  r.rates.elementwise_bytes_per_s = 2.5e12;
  r.rates.loss_bytes_per_s = 2.25e12;
  r.rates.host_link_bytes_per_s = 5.29e10 * (1 + 1e-15);
  r.rates.host_memory_bytes_per_s = 2.5e10;
  r.rates.op_latency_s = 4.7e-6 / 7;
  r.rates.peak_flops = 9.89e14;
  return r;
}

// A probe of this shape with [rates] on the CPU (the round numbers the plan tests read back).
ProbeResult cpu_rates_probe() {
  ProbeResult r;
  r.topology = load_topology_xml(topology_data("1pkg_nogpu.xml"));
  r.budgets = compute_host_budgets(r.topology, 2);
  r.rates_measured = true;
  r.rates = {"cpu", "cpu (2 cores)", "f32",  2,    "hidden 64", 1e10, 2e10, 3e10,
             4e10,  3.5e10,          2.5e10, 5e10, 6e10,        7e-7, 8e10};
  return r;
}

TEST(ProbeFile, RoundTripKeepsEverything) {
  TempDir dir;
  const std::string path = (dir.path() / "probe.toml").string();
  const ProbeResult r = full_probe();
  write_probe_file(path, r);
  const ProbeResult back = read_probe_file(path);
  EXPECT_EQ(back.topology, r.topology);
  EXPECT_EQ(back.budgets, r.budgets);
  EXPECT_EQ(back.bench, r.bench);
  EXPECT_TRUE(back.rates_measured);
  EXPECT_EQ(back.rates, r.rates);
  EXPECT_TRUE(back == r);
  // Written again, the same bytes.
  EXPECT_EQ(probe_to_toml(back), read_text(path));
  EXPECT_CONTAINS(read_text(path), "[[rank]]\nlocal_rank = 7\ngpu = 7\nnuma_node = 1\n");
}

TEST(ProbeFile, NoBenchRoundTrip) {
  TempDir dir;
  const std::string path = (dir.path() / "probe.toml").string();
  ProbeResult r;
  r.topology = load_topology_xml(topology_data("1pkg_nogpu.xml"));
  r.budgets = compute_host_budgets(r.topology, 2);
  write_probe_file(path, r);
  const ProbeResult back = read_probe_file(path);
  EXPECT_TRUE(back == r);
  EXPECT_FALSE(back.rates_measured);
  EXPECT_EQ(read_text(path).find("[bench]"), std::string::npos);
  EXPECT_EQ(read_text(path).find("[rates]"), std::string::npos);
}

TEST(ProbeFile, RatesWithoutTheBenchRoundTrip) {
  TempDir dir;
  const std::string path = (dir.path() / "probe.toml").string();
  const ProbeResult r = cpu_rates_probe();
  write_probe_file(path, r);
  const ProbeResult back = read_probe_file(path);
  EXPECT_TRUE(back == r);
  EXPECT_EQ(back.rates.op_latency_s, 7e-7);
  EXPECT_CONTAINS(read_text(path), "\n[rates]\nbackend = \"cpu\"\n");
  // op_latency_s = 0 is "not modelled" (MachineRates), so it reads back.
  ProbeResult zero = r;
  zero.rates.op_latency_s = 0;
  write_probe_file(path, zero);
  EXPECT_TRUE(read_probe_file(path) == zero);
}

TEST(ProbeFile, JsonMirrorsTheToml) {
  const nlohmann::json j = probe_to_json(full_probe());
  EXPECT_EQ(j["probe"]["format"], 1);
  EXPECT_EQ(j["machine"]["pus"], 32);
  ASSERT_EQ(j["rank"].size(), 8u);
  EXPECT_EQ(j["rank"][5]["numa_node"], 1);
  EXPECT_EQ(j["rank"][5]["host_budget_bytes"], 122620477440ull);
  EXPECT_EQ(j["nic"][1]["os_names"], "mlx5_0,ib0");
  EXPECT_DOUBLE_EQ(j["bench"]["row"][2]["gb_per_s"].get<double>(), 87.9);
  EXPECT_EQ(j["budget"]["node"].size(), 2u);
  EXPECT_EQ(j["rates"]["backend"], "cuda");
  EXPECT_EQ(j["rates"]["ranks_sharing"], 8);
  EXPECT_EQ(j["rates"]["gemm_flops"].get<double>(), full_probe().rates.gemm_flops);  // bitwise
  EXPECT_EQ(j["rates"]["op_latency_s"].get<double>(), full_probe().rates.op_latency_s);
  EXPECT_FALSE(probe_to_json(cpu_rates_probe()).contains("bench"));
}

TEST(ProbeFile, WriteFailsCleanlyAndKeepsTheOldFile) {
  TempDir dir;
  const std::string bad = (dir.path() / "missing-dir" / "probe.toml").string();
  EXPECT_CONTAINS(error_of([&] { write_probe_file(bad, full_probe()); }), bad);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

struct BadCase {
  std::string name, from, to;  // replace `from` by `to` in a good file
  std::string expect;          // in the error, after "FILE:"
};

TEST(ProbeFile, BadFilesNameFileLineAndKey) {
  TempDir dir;
  const std::string good = probe_to_toml(full_probe());
  auto line_of = [&](const std::string& text, const std::string& needle) {
    const size_t at = text.find(needle);
    return 1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n');
  };
  const std::vector<BadCase> cases = {
      {"not toml", "[machine]", "[machine", "not a valid probe file (TOML)"},
      {"wrong type", "pus = 32", "pus = \"32\"", "machine.pus must be an integer"},
      {"missing key", "cpus = \"16-31\"\n", "", "numa lacks the key cpus"},
      {"negative bytes", "memory_bytes = 549755813888\ncpus", "memory_bytes = -5\ncpus",
       "numa.memory_bytes must be at least 0"},
      {"format", "format = 1", "format = 2", "probe file format 2"},
      {"bad cpus", "cpus = \"16-31\"", "cpus = \"31-16\"", "runs backwards"},
      {"rank order", "local_rank = 3", "local_rank = 4", "expected local_rank = 3"},
      {"missing section", "[machine]", "[machinex]", "missing [machine]"},
      {"budget keys", "[budget]\nranks_per_node", "[budgetx]\nranks_per_node",
       "budget lacks the key ranks_per_node"},
  };
  for (const auto& c : cases) {
    std::string text = good;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.name;
    text.replace(at, c.from.size(), c.to);
    const std::string path = (dir.path() / (c.name + ".toml")).string();
    std::ofstream(path) << text;
    SCOPED_TRACE(c.name);
    const std::string e = error_of([&] { read_probe_file(path); });
    EXPECT_CONTAINS(e, path + ":");
    EXPECT_CONTAINS(e, c.expect);
    if (c.name == "wrong type")
      EXPECT_CONTAINS(e, path + ":" + std::to_string(line_of(text, "pus = \"32\"")) + ":");
  }
  const std::string missing = (dir.path() / "nope.toml").string();
  EXPECT_CONTAINS(error_of([&] { read_probe_file(missing); }), missing);
}

// Each bad [rates] entry: the error names the file, the line of the entry (the [rates] header for
// a missing key) and the key.
TEST(ProbeFile, BadRatesNameFileLineAndKey) {
  TempDir dir;
  const std::string good = probe_to_toml(full_probe());
  struct RatesCase {
    std::string name;
    std::string key;   // the line "KEY = ..." of [rates] is replaced by
    std::string line;  // this line ("" removes it)
    std::string expect;
    std::string line_of;  // the text whose line the error names
  };
  const std::vector<RatesCase> cases = {
      {"negative rate", "gemm_flops", "gemm_flops = -6.9e14",
       "rates.gemm_flops must be a positive finite number, got -6.9e+14", "gemm_flops = -"},
      {"zero rate", "memory_bytes_per_s", "memory_bytes_per_s = 0.0",
       "rates.memory_bytes_per_s must be a positive finite number, got 0", "memory_bytes_per_s"},
      {"infinite rate", "peak_flops", "peak_flops = inf",
       "rates.peak_flops must be a positive finite number, got inf", "peak_flops"},
      {"negative latency", "op_latency_s", "op_latency_s = -1e-6",
       "rates.op_latency_s must be a finite number >= 0, got -1e-06", "op_latency_s"},
      {"missing key", "attention_flops", "", "rates lacks the key attention_flops", "[rates]"},
      {"wrong type", "host_link_bytes_per_s", "host_link_bytes_per_s = \"fast\"",
       "rates.host_link_bytes_per_s must be a number", "host_link_bytes_per_s"},
      {"integer sharing as text", "ranks_sharing", "ranks_sharing = \"8\"",
       "rates.ranks_sharing must be an integer", "ranks_sharing"},
      {"dtype not a string", "dtype", "dtype = 16", "rates.dtype must be a string", "dtype = 16"},
      {"unknown backend", "backend", "backend = \"tpu\"",
       "rates.backend must be one of \"cpu\", \"cuda\", got \"tpu\"", "backend"},
      {"unknown dtype", "dtype", "dtype = \"f16\"",
       "rates.dtype must be one of \"f32\", \"bf16\", got \"f16\"", "dtype = "},
      {"no sharing ranks", "ranks_sharing", "ranks_sharing = 0",
       "rates.ranks_sharing must be at least 1, got 0", "ranks_sharing"},
  };
  const size_t rates_at = good.find("\n[rates]\n");
  ASSERT_NE(rates_at, std::string::npos);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string text = good;
    const size_t at = text.find("\n" + c.key + " = ", rates_at) + 1;
    ASSERT_GT(at, rates_at);
    const size_t end = text.find('\n', at) + 1;
    text.replace(at, end - at, c.line.empty() ? "" : c.line + "\n");
    const size_t line_at = text.find(c.line_of, rates_at);
    ASSERT_NE(line_at, std::string::npos);
    const long line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(line_at), '\n');
    const std::string path = (dir.path() / (c.name + ".toml")).string();
    std::ofstream(path) << text;
    const std::string e = error_of([&] { read_probe_file(path); });
    EXPECT_CONTAINS(e, path + ":" + std::to_string(line) + ": ");
    EXPECT_CONTAINS(e, c.expect);
  }
  // [[rates]] (an array) where a table belongs.
  std::string text = good;
  text.replace(rates_at, 9, "\n[[rates]]\n");
  const std::string path = (dir.path() / "rates array.toml").string();
  std::ofstream(path) << text;
  const std::string e = error_of([&] { read_probe_file(path); });
  EXPECT_CONTAINS(e, path + ":");
  EXPECT_CONTAINS(e, "rates must be a table");
}

Config config_with(const std::vector<std::string>& overrides) { return load_config({}, overrides); }

TEST(AutoBudget, AutoPinnedMemoryTakesTheProbeFilesBudget) {
  TempDir dir;
  const std::string path = (dir.path() / "probe.toml").string();
  const ProbeResult r = full_probe();
  write_probe_file(path, r);
  Config cfg = config_with({"runtime.probe_file=" + path, "runtime.pinned_memory=auto"});
  const AutoHostBudget b = probe_host_budgets(cfg, 13, 5, 8, false);
  EXPECT_EQ(b.source, path);
  EXPECT_EQ(b.rank, r.budgets.ranks[5]);
  EXPECT_EQ(pinned_memory_budget(cfg, 13, 5, 8, false), r.budgets.ranks[5].host_budget_bytes);
  // A set size wins over the probe.
  cfg = config_with({"runtime.probe_file=" + path, "runtime.pinned_memory=3GiB"});
  EXPECT_EQ(pinned_memory_budget(cfg, 13, 5, 8, false), 3 * GiB);
}

TEST(AutoBudget, HostNameInTheProbePathAndErrors) {
  TempDir dir;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  write_probe_file((dir.path() / (std::string("probe-") + host + ".toml")).string(), full_probe());
  const std::string pattern = (dir.path() / "probe-{host}.toml").string();
  Config cfg = config_with({"runtime.probe_file=" + pattern, "runtime.pinned_memory=auto"});
  EXPECT_EQ(probe_host_budgets(cfg, 0, 0, 8, false).rank.place.gpu, 0);
  // Nine ranks on a node probed for eight.
  std::string e = error_of([&] { probe_host_budgets(cfg, 8, 8, 9, false); });
  EXPECT_CONTAINS(e, "written for 8 ranks per node");
  EXPECT_CONTAINS(e, "--ranks-per-node 9");
  cfg = config_with(
      {"runtime.probe_file=" + (dir.path() / "none.toml").string(), "runtime.pinned_memory=auto"});
  EXPECT_CONTAINS(error_of([&] { pinned_memory_budget(cfg, 0, 0, 1, true); }), "none.toml");
  // A per-host path with no file for this host names the host, not only the path.
  TempDir empty;
  const std::string missing = (empty.path() / "probe-{host}.toml").string();
  cfg = config_with({"runtime.probe_file=" + missing, "runtime.pinned_memory=auto"});
  e = error_of([&] { pinned_memory_budget(cfg, 0, 0, 1, true); });
  EXPECT_CONTAINS(e, std::string("no probe file for host ") + host);
  EXPECT_CONTAINS(e, (empty.path() / (std::string("probe-") + host + ".toml")).string());
  EXPECT_CONTAINS(e, "slurm/probe.sbatch");
}

TEST(AutoBudget, CpuBackendWithoutAFileKeepsTheBackendDefault) {
  const Config cfg = config_with({"runtime.pinned_memory=auto"});
  EXPECT_EQ(pinned_memory_budget(cfg, 0, 0, 4, true), Backend::kCpuDefaultDeviceMemory / 2);
}

TEST(AutoBudget, StartUpProbeWithoutAFile) {
  Config cfg = config_with({"runtime.pinned_memory=auto"});
  const AutoHostBudget b = probe_host_budgets(cfg, 0, 0, 2, true);
  EXPECT_EQ(b.source, "start-up probe of this machine");
  EXPECT_EQ(b.rank.place.gpu, -1);
  EXPECT_EQ(b.rank.host_budget_bytes % (2 * MiB), 0u);
  EXPECT_EQ(b.rank.optimizer_budget_bytes + b.rank.sco_budget_bytes, b.rank.host_budget_bytes);
}

}  // namespace
}  // namespace moepeak::topology
