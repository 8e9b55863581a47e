// The probe file: what `moepeak probe` found on a node — topology, measured rates, each local
// rank's placement and host budgets — as TOML that `plan`, `train` and `tune` read through
// runtime.probe_file (format in docs/probe.md), and the same content as JSON for `--json`.
//
//   write_probe_file("probe.toml", result);   // atomic: temp file + rename, never half-written
//   ProbeResult r = read_probe_file("probe.toml");  // validates; errors name file:line and key
//
// Tests: ctest -R test_probe_file (round trip, bad files).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "topology/host_budget.h"
#include "topology/host_link_bench.h"
#include "topology/node_topology.h"

namespace moepeak::topology {

struct ProbeResult {
  static constexpr int kFormat = 1;
  std::string host;     // where it ran
  std::string date;     // "2026-11-30 10:00:00 UTC"
  std::string moepeak;  // version of the writer: "0.1.0 (git abc123)"
  NodeTopology topology;
  bool bench_run = false;  // false with --no-bench: `bench` is empty
  HostLinkBench bench;
  HostBudgets budgets;
  bool operator==(const ProbeResult&) const = default;
};

std::string probe_to_toml(const ProbeResult& r);
nlohmann::json probe_to_json(const ProbeResult& r);

// Throws moepeak::Error naming the path when it cannot be written; the old file stays intact.
void write_probe_file(const std::string& path, const ProbeResult& r);

// Throws moepeak::Error "FILE:LINE: ..." for a file that is not TOML, lacks a key, has a key of the
// wrong type, or has a format this moepeak does not know; "cannot read FILE" when unreadable.
ProbeResult read_probe_file(const std::string& path);

// The budget row of `local_rank`; throws moepeak::Error naming the file when the probe was written
// for fewer ranks per node.
const RankBudget& rank_budget(const ProbeResult& r, int local_rank, const std::string& path);

}  // namespace moepeak::topology
