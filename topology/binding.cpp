// binding.h: sched_setaffinity to the rank's PUs and a preferred NUMA node (libnuma).
// Tests: ctest -R test_topology.
#include "topology/binding.h"

#include <numa.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moepeak::topology {

BindResult bind_rank(const RankPlacement& place) {
  const std::vector<int> pus = parse_index_list(place.cpus);
  if (pus.empty()) MOEPEAK_THROW("rank ", place.local_rank, " has no PUs to bind to (cpus = \"", place.cpus, "\")");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int pu : pus) {
    if (pu >= CPU_SETSIZE) MOEPEAK_THROW("rank ", place.local_rank, ": PU ", pu, " is beyond CPU_SETSIZE");
    CPU_SET(pu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    MOEPEAK_THROW("rank ", place.local_rank, ": cannot bind to PUs ", place.cpus, ": ", std::strerror(errno),
                  " (are they outside this job's allocation? rerun `moepeak probe` inside it)");
  }
  if (numa_available() >= 0 && place.numa_node >= 0 && place.numa_node <= numa_max_node()) {
    numa_set_preferred(place.numa_node);
  }
  BindResult r;
  r.numa_node = place.numa_node;
  r.cpus = place.cpus;
  return r;
}

}  // namespace moepeak::topology
