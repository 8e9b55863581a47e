// The probe file: what `moepeak probe` found on a node — topology, measured rates (the host
// link's, and the step-time model's at a config's shapes), each local rank's placement and host
// budgets — as TOML that `plan`, `train` and `tune` read through runtime.probe_file (format in
// docs/probe.md), and the same content as JSON for `--json`.
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

// The step-time model's rates of one rank of the node (the file's optional [rates]; measured by
// core/measure/machine_measure.h at a config's shapes, core/plan/machine_rates.h's
// rates_from_probe turns them into MachineRates). FLOP/s, bytes/s (1e9 bytes = 1 GB) and seconds.
// NOTES: a plain struct because topology/ sits below core/plan/ (MachineRates); the field names
// are MachineRates' and the file's keys.
struct ProbeRates {
  std::string backend;    // "cpu" | "cuda": the backend the numbers were measured on
  std::string device;     // the CPU backend's describe(), or the GPU's name
  std::string dtype;      // "f32" | "bf16": the working dtype of the GEMMs and elementwise ops
  int ranks_sharing = 1;  // ranks per node: the numbers are one rank's share of cores or device
  std::string shapes;     // "hidden 512, seq 256 x batch 4 on W = 1, experts 8/2, ... from ..."
  double gemm_flops = 0;  // the dense GEMMs, forward and backward
  double grouped_gemm_flops = 0;       // the experts' grouped GEMMs
  double attention_flops = 0;          // attention, forward and backward
  double memory_bytes_per_s = 0;       // device memory (a streaming add)
  double elementwise_bytes_per_s = 0;  // the layers' elementwise ops (the SwiGLU), model bytes
  double loss_bytes_per_s = 0;         // the head's softmax cross-entropy, model bytes
  double host_link_bytes_per_s = 0;    // host <-> device, each way
  double host_memory_bytes_per_s = 0;  // the host's memory (a memcpy, read + write)
  double op_latency_s = 0;             // one op's fixed cost beyond its work (0: not modelled)
  double peak_flops = 0;               // the backend's GEMM ceiling, for MFU
  bool operator==(const ProbeRates&) const = default;
};

// The numbers of [rates] in the file's order: the key (a ProbeRates member of the same name), and
// how `moepeak probe` prints it. One list for the writer, the reader and the printout.
struct ProbeRateField {
  const char* key;
  double ProbeRates::*member;
  const char* label;     // the printout's name
  double scale;          // the printout's unit in the file's (1e9: GFLOP/s or GB/s)
  const char* unit;      // "GFLOP/s", "GB/s", "us"
  bool zero_ok = false;  // 0 is valid (else the reader wants a positive number)
};
inline constexpr ProbeRateField kProbeRateFields[] = {
    {"gemm_flops", &ProbeRates::gemm_flops, "gemm", 1e9, "GFLOP/s"},
    {"grouped_gemm_flops", &ProbeRates::grouped_gemm_flops, "grouped_gemm", 1e9, "GFLOP/s"},
    {"attention_flops", &ProbeRates::attention_flops, "attention", 1e9, "GFLOP/s"},
    {"memory_bytes_per_s", &ProbeRates::memory_bytes_per_s, "memory", 1e9, "GB/s"},
    {"elementwise_bytes_per_s", &ProbeRates::elementwise_bytes_per_s, "elementwise", 1e9, "GB/s"},
    {"loss_bytes_per_s", &ProbeRates::loss_bytes_per_s, "loss", 1e9, "GB/s"},
    {"host_link_bytes_per_s", &ProbeRates::host_link_bytes_per_s, "host_link", 1e9, "GB/s"},
    {"host_memory_bytes_per_s", &ProbeRates::host_memory_bytes_per_s, "host_memory", 1e9, "GB/s"},
    {"op_latency_s", &ProbeRates::op_latency_s, "op_latency", 1e-6, "us", /*zero_ok=*/true},
    {"peak_flops", &ProbeRates::peak_flops, "peak", 1e9, "GFLOP/s"},
};

struct ProbeResult {
  static constexpr int kFormat = 1;
  std::string host;     // where it ran
  std::string date;     // "2026-11-30 10:00:00 UTC"
  std::string moepeak;  // version of the writer: "0.1.0 (git abc123)"
  NodeTopology topology;
  bool bench_run = false;  // false with --no-bench: `bench` is empty
  HostLinkBench bench;
  HostBudgets budgets;
  bool rates_measured = false;  // the file has [rates] (not with --no-bench or --topology-xml)
  ProbeRates rates;
  bool operator==(const ProbeResult&) const = default;
};

std::string probe_to_toml(const ProbeResult& r);
nlohmann::json probe_to_json(const ProbeResult& r);

// Throws moepeak::Error naming the path when it cannot be written; the old file stays intact.
void write_probe_file(const std::string& path, const ProbeResult& r);

// Throws moepeak::Error "FILE:LINE: ..." for a file that is not TOML, lacks a key, has a key of the
// wrong type, or has a format this moepeak does not know; "cannot read FILE" when unreadable.
// [rates] is optional (files written before it, or with --no-bench, have none); when present every
// key is required, each rate a positive finite number (op_latency_s: finite, >= 0).
ProbeResult read_probe_file(const std::string& path);

// The budget row of `local_rank`; throws moepeak::Error naming the file when the probe was written
// for fewer ranks per node.
const RankBudget& rank_budget(const ProbeResult& r, int local_rank, const std::string& path);

}  // namespace moepeak::topology
