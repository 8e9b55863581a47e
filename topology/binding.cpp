// binding.h: sched_setaffinity to the rank's PUs and a preferred NUMA node (libnuma).
// Tests: ctest -R test_topology.
#include "topology/binding.h"

#include <numa.h>
#include <sched.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "topology/auto_budget.h"

namespace moepeak::topology {

BindResult bind_rank(const RankPlacement& place) {
  const std::vector<int> pus = parse_index_list(place.cpus);
  if (pus.empty())
    MOEPEAK_INPUT_ERROR("rank ", place.local_rank, " has no PUs to bind to (cpus = \"", place.cpus,
                        "\")");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int pu : pus) {
    if (pu >= CPU_SETSIZE)
      MOEPEAK_INPUT_ERROR("rank ", place.local_rank, ": PU ", pu, " is beyond CPU_SETSIZE");
    CPU_SET(pu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    MOEPEAK_INPUT_ERROR("rank ", place.local_rank, ": cannot bind to PUs ", place.cpus, ": ",
                        std::strerror(errno),
                        " (are they outside this job's allocation? rerun `moepeak probe` inside "
                        "it)");
  }
  if (numa_available() >= 0 && place.numa_node >= 0 && place.numa_node <= numa_max_node()) {
    numa_set_preferred(place.numa_node);
  }
  BindResult r;
  r.numa_node = place.numa_node;
  r.cpus = place.cpus;
  return r;
}

namespace {

std::vector<int> allowed_pus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) out.push_back(i);
  }
  return out;
}

// The NUMA node all of `pus` sit on, else -1.
int numa_node_of(const std::vector<int>& pus) {
  if (pus.empty() || numa_available() < 0) return -1;
  const int node = numa_node_of_cpu(pus.front());
  for (int pu : pus) {
    if (numa_node_of_cpu(pu) != node) return -1;
  }
  return node;
}

}  // namespace

BindDecision decide_binding(BindPolicy policy, int ranks_on_host, int allowed, int online) {
  BindDecision d;
  switch (policy) {
    case BindPolicy::none:
      d.reason = "runtime.bind = \"none\"";
      return d;
    case BindPolicy::rank:
      d.bind = true;
      return d;
    case BindPolicy::automatic:
      break;
  }
  if (allowed > 0 && allowed < online) {
    d.reason = "the launcher bound it already (" + std::to_string(allowed) + " of " +
               std::to_string(online) + " PUs; runtime.bind = \"rank\" rebinds)";
  } else if (ranks_on_host > online) {
    d.reason = std::to_string(ranks_on_host) + " ranks share " + std::to_string(online) +
               " PUs on this host (runtime.bind = \"rank\" binds anyway)";
  } else {
    d.bind = true;
  }
  return d;
}

int TrainBinding::pus() const {
  return cpus.empty() ? 0 : static_cast<int>(parse_index_list(cpus).size());
}

TrainBinding bind_for_training(const Config& cfg, int rank, int local_rank, int local_size,
                               bool cpu_backend) {
  TrainBinding t;
  const std::vector<int> before = allowed_pus();
  const int online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const BindDecision d =
      decide_binding(cfg.runtime.bind, local_size, static_cast<int>(before.size()), online);
  if (d.bind) {
    AutoHostBudget budget = probe_host_budgets(cfg, rank, local_rank, local_size, cpu_backend);
    t.place = budget.rank.place;
    t.place_source = std::move(budget.source);
    bind_rank(t.place);
    t.bound = true;
  }
  t.reason = d.reason;
  const std::vector<int> now = t.bound ? parse_index_list(t.place.cpus) : before;
  t.cpus = format_index_list(now);
  t.numa_node = numa_node_of(now);
  return t;
}

}  // namespace moepeak::topology
