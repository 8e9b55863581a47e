// NUMA facts the runtime needs before `moepeak probe` has run: which node the calling thread is
// on and how much memory each node has (libnuma). `moepeak probe` builds the full picture.
#pragma once

#include <cstdint>

namespace moepeak {

// Number of NUMA nodes (1 where the kernel has no NUMA support).
int numa_node_count();
// Node of the CPU the calling thread runs on (0 without NUMA support).
int current_numa_node();

struct NumaNodeMemory {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};
// Memory of one node as the kernel reports it for that node. NOTES: in VMs and containers a
// node can report less than /proc/meminfo's total; never assume the two agree.
NumaNodeMemory numa_node_memory(int node);

// Physical memory of the whole host (sysinfo): total and available.
NumaNodeMemory host_memory();

}  // namespace moepeak
