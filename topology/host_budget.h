// Host budgets: where each rank of a node runs (GPU, NUMA node, cores) and how much pinned host
// memory it may take for SCO boundaries and the offloaded optimizer — pure arithmetic over a
// NodeTopology, unit-tested on synthetic topologies (ctest -R test_host_budget).
//
// Placement (place_ranks):
//   - with GPUs: local rank r drives GPU r and lives on that GPU's NUMA node (ranks_per_node must
//     not exceed the GPUs); a GPU of unknown locality gets node r * nodes / ranks;
//   - without: ranks fill the NUMA nodes that have cores in contiguous blocks (r * nodes / ranks);
//   - the PUs of a node are split into contiguous, equal shares among the ranks placed on it.
// Budget per NUMA node n with memory M_n and k_n ranks (docs/probe.md gives the reasons):
//   reserve_n = max(node_reserve_min, node_reserve_fraction * M_n)   OS, daemons, page cache
//   usable_n  = max(0, M_n - reserve_n - k_n * rank_reserve)         rank_reserve: each rank's own
//               heap, MPI/NCCL buffers, CUDA context; + cpu_device_memory on a node without GPUs
//               (the CPU backend's "device" arena is host memory)
//   host_n    = usable_n / k_n, rounded down to 2 MiB (the pinned pool's block granularity)
//   optimizer = host_n * optimizer_share (rounded down to 2 MiB); sco = host_n - optimizer
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/node_topology.h"

namespace moepeak::topology {

struct BudgetPolicy {
  double node_reserve_fraction = 0.10;
  uint64_t node_reserve_min_bytes = 2ull << 30;  // 2 GiB
  uint64_t rank_reserve_bytes = 1ull << 30;      // 1 GiB per rank
  uint64_t cpu_device_memory_bytes = 2ull
                                     << 30;  // CPU backend arena per rank (runtime.device_memory)
  double optimizer_share = 0.75;             // of each rank's host budget; SCO gets the rest
  bool operator==(const BudgetPolicy&) const = default;
};

struct RankPlacement {
  int local_rank = 0;
  int gpu = -1;       // CUDA ordinal (or PCI GPU slot of a topology file); -1 on a CPU-only node
  int numa_node = 0;  // os_index
  std::string cpus;   // this rank's PUs, "0-3"
  bool operator==(const RankPlacement&) const = default;
};

struct NodeBudget {
  int numa_node = 0;
  uint64_t memory_bytes = 0;
  int ranks = 0;
  uint64_t reserve_bytes = 0;       // reserve_n
  uint64_t rank_reserve_bytes = 0;  // k_n * rank_reserve (+ CPU arenas)
  uint64_t usable_bytes = 0;        // usable_n
  bool operator==(const NodeBudget&) const = default;
};

struct RankBudget {
  RankPlacement place;
  uint64_t host_budget_bytes = 0;  // what runtime.pinned_memory = "auto" takes
  uint64_t optimizer_budget_bytes = 0;
  uint64_t sco_budget_bytes = 0;
  bool operator==(const RankBudget&) const = default;
};

struct HostBudgets {
  BudgetPolicy policy;
  int ranks_per_node = 0;
  std::vector<NodeBudget> nodes;  // every NUMA node, ranks or not
  std::vector<RankBudget> ranks;  // by local rank
  bool operator==(const HostBudgets&) const = default;
};

// Ranks per node when the user gives none: one per GPU, else one per NUMA node with cores.
int default_ranks_per_node(const NodeTopology& topo);

// Throws moepeak::Error for ranks_per_node < 1, more ranks than GPUs on a GPU node, or a
// topology without a NUMA node that has cores.
std::vector<RankPlacement> place_ranks(const NodeTopology& topo, int ranks_per_node);
HostBudgets compute_host_budgets(const NodeTopology& topo, int ranks_per_node,
                                 const BudgetPolicy& policy = {});

// "0-3,8-11" -> {0,1,2,3,8,9,10,11}; throws moepeak::Error on anything else.
std::vector<int> parse_index_list(const std::string& text);

}  // namespace moepeak::topology
