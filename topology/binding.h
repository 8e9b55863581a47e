// Binding a rank to its place (issue 10 item 4): the calling thread — and every thread it starts
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

#include "topology/host_budget.h"

namespace moepeak::topology {

struct BindResult {
  int numa_node = -1;   // the node the pinned pool should use
  std::string cpus;     // the PUs the thread now runs on
};

// Throws moepeak::Error naming the PUs when the kernel refuses the affinity (e.g. PUs outside this
// process's cgroup) or the place names no PU.
BindResult bind_rank(const RankPlacement& place);

}  // namespace moepeak::topology
