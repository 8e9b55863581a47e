// Host-link bandwidth for `moepeak probe`: how fast SCO boundaries and optimizer state can move.
//
//   - every machine: memcpy bandwidth between host buffers, pinned (numa_alloc_onnode + mlock)
//     and pageable (malloc), from each NUMA node's memory to a thread on the first node;
//   - with GPUs: per GPU, pinned host->device, device->host and both at once from the GPU's
//     local NUMA node (and from one remote node where there is one), and pageable for comparison;
//   - the cost of pinning: allocating + first-touching, mlock, and cudaHostRegister with a GPU.
// Rates are GB/s (1e9 bytes/s) of bytes moved; a memcpy of n bytes counts n. Medians over the
// timed repetitions after one warm-up. Tests check they are > 0, never their size
// (ctest -R test_topology).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/node_topology.h"

namespace moepeak::topology {

struct BandwidthRow {
  std::string kind;    // "memcpy", "h2d", "d2h", "bidir"
  std::string memory;  // "pinned", "pageable"
  int gpu = -1;        // CUDA ordinal, -1 for memcpy rows
  int numa_node = 0;   // node holding the host buffer
  bool local = true;   // the buffer's node is the GPU's (memcpy: the copying thread's) node
  uint64_t bytes = 0;
  double gb_per_s = 0;
  bool operator==(const BandwidthRow&) const = default;
};

struct PinningCost {
  int numa_node = 0;
  uint64_t bytes = 0;
  double alloc_touch_s = 0;  // numa_alloc_onnode + writing every page once
  double mlock_s = 0;        // mlock of the touched buffer (0 when RLIMIT_MEMLOCK refused it)
  bool mlock_ok = false;
  double cuda_register_s = -1;  // cudaHostRegister; -1 without a GPU
  bool operator==(const PinningCost&) const = default;
};

struct HostLinkBench {
  uint64_t bytes = 0;  // buffer size of every row
  int iters = 0;
  std::vector<BandwidthRow> rows;
  PinningCost pinning;
  std::vector<std::string> notes;  // what could not be measured, and why
  bool operator==(const HostLinkBench&) const = default;
};

struct BenchOptions {
  uint64_t bytes = 256ull << 20;  // 256 MiB per buffer
  int iters = 5;
};

// Runs the measurements above on this machine (`topo` from load_this_machine()). Restores the
// calling thread's CPU affinity afterwards. Throws moepeak::Error when host memory for the
// buffers cannot be had.
HostLinkBench run_host_link_bench(const NodeTopology& topo, const BenchOptions& options);

}  // namespace moepeak::topology
