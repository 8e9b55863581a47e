// host_budget.h: rank placement and the host-budget arithmetic. Tests: ctest -R test_host_budget.
#include "topology/host_budget.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "core/units.h"

namespace moepeak::topology {
namespace {

constexpr uint64_t kGranule = 2 * MiB;  // PinnedPool::kBlockGranularity

uint64_t round_down(uint64_t bytes) { return bytes / kGranule * kGranule; }

// The most indices (and one past the largest index) an index list may hold: far above any
// machine's CPU count (Linux's own limit is 8192), far below what would exhaust memory.
constexpr int kMaxIndexListEntries = 1 << 20;

}  // namespace

std::vector<int> parse_index_list(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  size_t pos = 0;
  auto number = [&](int& v) {
    const char* b = text.data() + pos;
    auto [p, ec] = std::from_chars(b, text.data() + text.size(), v);
    if (ec != std::errc() || p == b || v < 0)
      MOEPEAK_INPUT_ERROR("bad index list \"", text, "\" (expected e.g. \"0-3,8-11\")");
    pos = static_cast<size_t>(p - text.data());
  };
  while (pos < text.size()) {
    int a = 0, b = 0;
    number(a);
    b = a;
    if (pos < text.size() && text[pos] == '-') {
      ++pos;
      number(b);
      if (b < a)
        MOEPEAK_INPUT_ERROR("bad index list \"", text, "\": range ", a, "-", b, " runs backwards");
    }
    // NOTES: a bound, so that a damaged list ("0-2147483647") is an error, not 8 GiB of indices
    // and a signed overflow at INT_MAX (a probe file's [[numa]] cpus, tests/fuzz).
    if (b >= kMaxIndexListEntries ||
        out.size() + static_cast<size_t>(b - a) >= static_cast<size_t>(kMaxIndexListEntries))
      MOEPEAK_INPUT_ERROR("bad index list \"", text.substr(0, 64), "\": more than ",
                          kMaxIndexListEntries, " indices, or an index >= ", kMaxIndexListEntries);
    for (int i = a; i <= b; ++i) out.push_back(i);
    if (pos < text.size()) {
      if (text[pos] != ',' || pos + 1 == text.size())
        MOEPEAK_INPUT_ERROR("bad index list \"", text, "\" (expected e.g. \"0-3,8-11\")");
      ++pos;
    }
  }
  return out;
}

int default_ranks_per_node(const NodeTopology& topo) {
  if (topo.gpu_count() > 0) return topo.gpu_count();
  int nodes = 0;
  for (const auto& n : topo.numa_nodes) nodes += n.pus > 0;
  return std::max(1, nodes);
}

std::vector<RankPlacement> place_ranks(const NodeTopology& topo, int ranks_per_node) {
  MOEPEAK_CHECK(ranks_per_node >= 1, "ranks per node must be at least 1, got ", ranks_per_node);
  std::vector<const NumaNodeInfo*> compute_nodes;  // nodes with cores, by os_index
  for (const auto& n : topo.numa_nodes) {
    if (n.pus > 0) compute_nodes.push_back(&n);
  }
  if (compute_nodes.empty())
    MOEPEAK_INPUT_ERROR("topology ", topo.source, " has no NUMA node with cores to run ranks on");
  const int gpus = topo.gpu_count();
  if (gpus > 0 && ranks_per_node > gpus) {
    MOEPEAK_INPUT_ERROR(ranks_per_node, " ranks per node but ", topo.source, " has ", gpus, " GPU",
                        gpus == 1 ? "" : "s", ": run one rank per GPU (--ranks-per-node ", gpus,
                        " or fewer)");
  }
  const int nodes = static_cast<int>(compute_nodes.size());
  std::vector<RankPlacement> out(ranks_per_node);
  for (int r = 0; r < ranks_per_node; ++r) {
    RankPlacement& p = out[r];
    p.local_rank = r;
    p.gpu = gpus > 0 ? r : -1;
    const int gpu_node = gpus > 0 ? topo.gpu_numa_node(r) : -1;
    const bool known =
        gpu_node >= 0 && topo.numa_node(gpu_node) && topo.numa_node(gpu_node)->pus > 0;
    p.numa_node =
        known ? gpu_node : compute_nodes[static_cast<size_t>(r) * nodes / ranks_per_node]->os_index;
  }
  // Split each node's PUs among the ranks placed on it, in local-rank order.
  for (const NumaNodeInfo* n : compute_nodes) {
    std::vector<RankPlacement*> here;
    for (auto& p : out) {
      if (p.numa_node == n->os_index) here.push_back(&p);
    }
    const std::vector<int> pus = parse_index_list(n->cpus);
    const size_t k = here.size();
    for (size_t i = 0; i < k && !pus.empty(); ++i) {
      size_t begin = i * pus.size() / k, end = (i + 1) * pus.size() / k;
      if (end == begin) {  // more ranks than PUs: ranks share one
        begin = i % pus.size();
        end = begin + 1;
      }
      here[i]->cpus = format_index_list(std::vector<int>(pus.begin() + begin, pus.begin() + end));
    }
  }
  return out;
}

HostBudgets compute_host_budgets(const NodeTopology& topo, int ranks_per_node,
                                 const BudgetPolicy& policy) {
  MOEPEAK_CHECK(policy.node_reserve_fraction >= 0 && policy.node_reserve_fraction < 1,
                "node reserve fraction must be in [0, 1), got ", policy.node_reserve_fraction);
  MOEPEAK_CHECK(policy.optimizer_share >= 0 && policy.optimizer_share <= 1,
                "optimizer share must be in [0, 1], got ", policy.optimizer_share);
  HostBudgets hb;
  hb.policy = policy;
  hb.ranks_per_node = ranks_per_node;
  const std::vector<RankPlacement> places = place_ranks(topo, ranks_per_node);
  const bool cpu_node = topo.gpu_count() == 0;
  const uint64_t per_rank_reserve =
      policy.rank_reserve_bytes + (cpu_node ? policy.cpu_device_memory_bytes : 0);
  for (const auto& n : topo.numa_nodes) {
    NodeBudget nb;
    nb.numa_node = n.os_index;
    nb.memory_bytes = n.memory_bytes;
    nb.ranks =
        static_cast<int>(std::count_if(places.begin(), places.end(), [&](const RankPlacement& p) {
          return p.numa_node == n.os_index;
        }));
    const auto fraction =
        static_cast<uint64_t>(policy.node_reserve_fraction * static_cast<double>(n.memory_bytes));
    nb.reserve_bytes = std::min(n.memory_bytes, std::max(policy.node_reserve_min_bytes, fraction));
    nb.rank_reserve_bytes = static_cast<uint64_t>(nb.ranks) * per_rank_reserve;
    const uint64_t taken = nb.reserve_bytes + nb.rank_reserve_bytes;
    nb.usable_bytes = n.memory_bytes > taken ? n.memory_bytes - taken : 0;
    hb.nodes.push_back(nb);
  }
  for (const auto& p : places) {
    RankBudget rb;
    rb.place = p;
    const auto node = std::find_if(hb.nodes.begin(), hb.nodes.end(), [&](const NodeBudget& nb) {
      return nb.numa_node == p.numa_node;
    });
    rb.host_budget_bytes = round_down(node->usable_bytes / static_cast<uint64_t>(node->ranks));
    rb.optimizer_budget_bytes = round_down(
        static_cast<uint64_t>(policy.optimizer_share * static_cast<double>(rb.host_budget_bytes)));
    rb.sco_budget_bytes = rb.host_budget_bytes - rb.optimizer_budget_bytes;
    hb.ranks.push_back(rb);
  }
  return hb;
}

}  // namespace moepeak::topology
