// The hook from the config's "auto" host budgets to the probe:
//
//   runtime.pinned_memory = "auto"   -> this rank's host_budget_bytes
//   (schedules.sco_host_budget = "auto" keeps its meaning, "what the pinned pool can still give",
//    which with the pool sized here is the rank's budget less the optimizer state it holds)
//
// from runtime.probe_file when it is set (a "{host}" in the path is replaced by this host's name,
// so one setting serves the per-node files that slurm gathers), else from a probe of this machine
// at start-up (topology only, no bandwidth runs; cheap) — on the CPU backend without a probe file
// pinned_memory_budget keeps the backend's default instead. Tests: ctest -R test_probe_file.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/config.h"
#include "topology/host_budget.h"

namespace moepeak::topology {

struct AutoHostBudget {
  RankBudget rank;     // placement (GPU, NUMA node, cores) and the three budgets
  std::string source;  // the probe file read, or "start-up probe of this machine"
};

// This rank's placement and host budgets as the probe says. `cpu_backend`: ranks run on the CPU
// backend, so the GPUs of the machine are not theirs (ranks fill the NUMA nodes and each rank's
// "device" arena, runtime.device_memory, is taken from host memory). Throws moepeak::Error naming
// the probe file when it is unreadable, invalid, or written for fewer ranks per node than
// local_size, and naming this host when a per-host path ("{host}") has no file for it.
AutoHostBudget probe_host_budgets(const Config& cfg, int rank, int local_rank, int local_size,
                                  bool cpu_backend);

// runtime.pinned_memory in bytes: the configured size, or for "auto" probe_host_budgets' host
// budget — except on the CPU backend without runtime.probe_file, where "auto" is the backend's
// default (Backend::kCpuDefaultDeviceMemory / 2). What the trainer gives
// BackendOptions::pinned_budget.
uint64_t pinned_memory_budget(const Config& cfg, int rank, int local_rank, int local_size,
                              bool cpu_backend);

// runtime.probe_file with "{host}" replaced by this host's name.
std::string resolve_probe_path(const std::string& configured);

}  // namespace moepeak::topology
