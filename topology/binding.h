// Binding a rank to its place (runtime.bind): the calling thread — and every thread it starts
// afterwards (stream workers, OpenBLAS, MPI progress) — runs on the rank's PUs, and its memory
// policy prefers the rank's NUMA node, so pageable allocations land there too; the pinned pool is
// put on the same node by passing `numa_node` to BackendOptions. Call before Backend::create.
//
//   AutoHostBudget b = probe_host_budgets(cfg, rank, local_rank, local_size, cpu_backend);
//   BindResult bound = bind_rank(b.rank.place);   // then options.numa_node = bound.numa_node
//
// Tests: ctest -R test_topology (binds a thread of this machine and reads the affinity back).
#pragma once

#include <string>

#include "core/config/config.h"
#include "topology/host_budget.h"

namespace moepeak::topology {

struct BindResult {
  int numa_node = -1;  // the node the pinned pool should use
  std::string cpus;    // the PUs the thread now runs on
};

// Throws moepeak::Error naming the PUs when the kernel refuses the affinity (e.g. PUs outside this
// process's cgroup) or the place names no PU.
BindResult bind_rank(const RankPlacement& place);

// Whether runtime.bind lets a rank bind, from what the process sees at start-up:
//   none -> no; rank -> yes;
//   auto -> no when the launcher bound the rank already (its affinity, allowed_pus, is narrower
//           than the host's online PUs: srun --cpu-bind, mpirun --bind-to; that binding is kept),
//           no when the host has more ranks than PUs (shares of less than a PU would serialise
//           ranks that the kernel could otherwise spread), else yes.
struct BindDecision {
  bool bind = false;
  std::string reason;  // why not, for the log ("" when bind)
};
BindDecision decide_binding(BindPolicy policy, int ranks_on_host, int allowed_pus, int online_pus);

// runtime.bind at train start: this rank's place from the probe (runtime.probe_file, else a
// start-up probe; probe_host_budgets), then bind_rank when decide_binding says so. Call before
// Backend::create, so the pinned pool (numa_node -1 = the calling thread's node) and every thread
// the backend starts follow. Throws moepeak::Error when runtime.bind = "rank" and the kernel
// refuses the PUs.
struct TrainBinding {
  RankPlacement place;       // where the probe puts this rank
  std::string place_source;  // the probe file it came from, or the start-up probe ("" unbound)
  bool bound = false;
  std::string cpus;    // the PUs this process may run on now
  int numa_node = -1;  // the node of those PUs (-1 when unknown)
  std::string reason;  // why it was not bound
  int pus() const;     // how many PUs `cpus` names
};
TrainBinding bind_for_training(const Config& cfg, int rank, int local_rank, int local_size,
                               bool cpu_backend);

}  // namespace moepeak::topology
