// auto_budget.h: "auto" host budgets from the probe file or a start-up probe.
// Tests: ctest -R test_probe_file.
#include "topology/auto_budget.h"

#include <unistd.h>

#include <filesystem>
#include <string_view>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "topology/node_topology.h"
#include "topology/probe_file.h"

namespace moepeak::topology {

namespace {
constexpr std::string_view kHostKey = "{host}";

std::string this_host() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}
}  // namespace

std::string resolve_probe_path(const std::string& configured) {
  std::string path = configured;
  for (size_t at; (at = path.find(kHostKey)) != std::string::npos;) {
    path.replace(at, kHostKey.size(), this_host());
  }
  return path;
}

AutoHostBudget probe_host_budgets(const Config& cfg, int rank, int local_rank, int local_size,
                                  bool cpu_backend) {
  MOEPEAK_CHECK(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " of ",
                local_size);
  AutoHostBudget out;
  if (!cfg.runtime.probe_file.empty()) {
    const std::string path = resolve_probe_path(cfg.runtime.probe_file);
    // A job on many nodes reads one file per node: the node whose file is missing is the news.
    if (cfg.runtime.probe_file.find(kHostKey) != std::string::npos &&
        !std::filesystem::exists(path)) {
      MOEPEAK_INPUT_ERROR("runtime.probe_file '", cfg.runtime.probe_file,
                          "': no probe file for host ", this_host(), " (", path,
                          " does not exist); probe every node of the job (sbatch -N <nodes> "
                          "slurm/probe.sbatch) or run `moepeak probe --output ",
                          path, "` on ", this_host());
    }
    const ProbeResult probe = read_probe_file(path);
    if (probe.budgets.ranks_per_node < local_size) {
      MOEPEAK_INPUT_ERROR("runtime.probe_file ", path, " was written for ",
                          probe.budgets.ranks_per_node, " ranks per node, but rank ", rank,
                          " is one of ", local_size,
                          " on this node: rerun `moepeak probe "
                          "--ranks-per-node ",
                          local_size, "`");
    }
    out.rank = rank_budget(probe, local_rank, path);
    out.source = path;
    return out;
  }
  NodeTopology topo = load_this_machine();
  BudgetPolicy policy;
  if (cpu_backend) {
    topo.gpus.clear();
    topo.pci_gpus.clear();
    policy.cpu_device_memory_bytes = cfg.runtime.device_memory_bytes().value_or(2 * GiB);
  }
  const HostBudgets budgets = compute_host_budgets(topo, local_size, policy);
  out.rank = budgets.ranks[local_rank];
  out.source = "start-up probe of this machine";
  return out;
}

uint64_t pinned_memory_budget(const Config& cfg, int rank, int local_rank, int local_size,
                              bool cpu_backend) {
  if (auto bytes = cfg.runtime.pinned_memory_bytes()) return *bytes;
  // NOTES: on the CPU backend without a probe file "auto" stays the backend's fixed default: a
  // start-up probe would split a small VM's node among its ranks and can leave each nothing (4
  // ranks on a 5 GiB node), which would turn runs that fit today into errors.
  if (cpu_backend && cfg.runtime.probe_file.empty()) return Backend::kCpuDefaultDeviceMemory / 2;
  return probe_host_budgets(cfg, rank, local_rank, local_size, cpu_backend).rank.host_budget_bytes;
}

}  // namespace moepeak::topology
