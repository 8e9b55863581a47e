// Rank placement (GPU -> NUMA node, CPU-only blocks, core shares) and the host-budget arithmetic
// of topology/host_budget.h on the synthetic topologies of data/. Expected bytes are worked out
// by hand from the formula in host_budget.h (docs/probe.md).
// Run: ctest -R test_host_budget
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "core/units.h"
#include "tests/expect_contains.h"
#include "tests/topology/topology_data.h"
#include "topology/host_budget.h"
#include "topology/node_topology.h"

namespace moepeak::topology {
namespace {

using test_support::topology_data;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

NodeTopology two_by_four() { return load_topology_xml(topology_data("2pkg_4gpu.xml")); }
NodeTopology cpu_only() { return load_topology_xml(topology_data("1pkg_nogpu.xml")); }

TEST(PlaceRanks, OneRankPerGpuOnTheGpusNode) {
  const NodeTopology t = two_by_four();
  EXPECT_EQ(default_ranks_per_node(t), 8);
  const auto p = place_ranks(t, 8);
  ASSERT_EQ(p.size(), 8u);
  const char* cpus[8] = {"0-3", "4-7", "8-11", "12-15", "16-19", "20-23", "24-27", "28-31"};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p[r].local_rank, r);
    EXPECT_EQ(p[r].gpu, r);
    EXPECT_EQ(p[r].numa_node, r < 4 ? 0 : 1) << "rank " << r;
    EXPECT_EQ(p[r].cpus, cpus[r]) << "rank " << r;
  }
}

TEST(PlaceRanks, FewerRanksThanGpusTakeTheFirstGpus) {
  const auto p = place_ranks(two_by_four(), 2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].numa_node, 0);
  EXPECT_EQ(p[1].numa_node, 0);
  EXPECT_EQ(p[0].cpus, "0-7");
  EXPECT_EQ(p[1].cpus, "8-15");
}

TEST(PlaceRanks, MoreRanksThanGpusIsAnError) {
  const std::string e = error_of([] { place_ranks(two_by_four(), 9); });
  EXPECT_CONTAINS(e, "9 ranks per node");
  EXPECT_CONTAINS(e, "8 GPUs");
  EXPECT_CONTAINS(error_of([] { place_ranks(two_by_four(), 0); }), "at least 1");
}

TEST(PlaceRanks, CpuOnlyRanksFillNodesInBlocks) {
  NodeTopology t = two_by_four();
  t.pci_gpus.clear();  // the same machine without GPUs
  EXPECT_EQ(default_ranks_per_node(t), 2);
  const auto p = place_ranks(t, 4);
  const int nodes[4] = {0, 0, 1, 1};
  const char* cpus[4] = {"0-7", "8-15", "16-23", "24-31"};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(p[r].gpu, -1);
    EXPECT_EQ(p[r].numa_node, nodes[r]);
    EXPECT_EQ(p[r].cpus, cpus[r]);
  }
  const auto three = place_ranks(t, 3);  // 0 and 1 on node 0 (r * 2 / 3), 2 on node 1
  EXPECT_EQ(three[0].numa_node, 0);
  EXPECT_EQ(three[1].numa_node, 0);
  EXPECT_EQ(three[2].numa_node, 1);
  EXPECT_EQ(three[2].cpus, "16-31");
}

TEST(PlaceRanks, GpuOfUnknownLocalityFallsBackToBlocks) {
  NodeTopology t = two_by_four();
  for (auto& g : t.pci_gpus) g.numa_node = -1;
  const auto p = place_ranks(t, 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p[r].numa_node, r < 4 ? 0 : 1);
}

TEST(PlaceRanks, MoreRanksThanPusShareThem) {
  const auto p = place_ranks(cpu_only(), 5);  // 4 PUs
  const char* cpus[5] = {"0", "0", "1", "2", "3"};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(p[r].cpus, cpus[r]) << "rank " << r;
}

TEST(HostBudget, TwoByFourEightRanks) {
  const HostBudgets b = compute_host_budgets(two_by_four(), 8);
  ASSERT_EQ(b.nodes.size(), 2u);
  ASSERT_EQ(b.ranks.size(), 8u);
  // M = 512 GiB = 549755813888; reserve = max(2 GiB, 0.10 M) = 54975581388;
  // 4 ranks x 1 GiB = 4294967296 (GPU node: no CPU arena); usable = 490485265204;
  // per rank 490485265204 / 4 = 122621316301 -> 2 MiB multiple 122620477440;
  // optimizer 0.75 x that = 91965358080 -> 91964309504; sco = 30656167936.
  for (const auto& n : b.nodes) {
    EXPECT_EQ(n.memory_bytes, 549755813888u);
    EXPECT_EQ(n.ranks, 4);
    EXPECT_EQ(n.reserve_bytes, 54975581388u);
    EXPECT_EQ(n.rank_reserve_bytes, 4 * GiB);
    EXPECT_EQ(n.usable_bytes, 490485265204u);
  }
  for (const auto& r : b.ranks) {
    EXPECT_EQ(r.host_budget_bytes, 122620477440u);
    EXPECT_EQ(r.optimizer_budget_bytes, 91964309504u);
    EXPECT_EQ(r.sco_budget_bytes, 30656167936u);
    EXPECT_EQ(r.host_budget_bytes % (2 * MiB), 0u);
  }
}

TEST(HostBudget, CpuOnlyNodeTakesTheArenaFromHostMemory) {
  const HostBudgets b = compute_host_budgets(cpu_only(), 2);
  ASSERT_EQ(b.nodes.size(), 1u);
  // M = 64 GiB = 68719476736; reserve = 0.10 M = 6871947673 (> 2 GiB);
  // 2 ranks x (1 GiB + 2 GiB CPU arena) = 6442450944; usable = 55405078119;
  // per rank 27702539059 -> 27701280768; optimizer 20774387712; sco 6926893056.
  EXPECT_EQ(b.nodes[0].reserve_bytes, 6871947673u);
  EXPECT_EQ(b.nodes[0].rank_reserve_bytes, 6 * GiB);
  EXPECT_EQ(b.nodes[0].usable_bytes, 55405078119u);
  for (const auto& r : b.ranks) {
    EXPECT_EQ(r.host_budget_bytes, 27701280768u);
    EXPECT_EQ(r.optimizer_budget_bytes, 20774387712u);
    EXPECT_EQ(r.sco_budget_bytes, 6926893056u);
  }
}

TEST(HostBudget, NodesWithoutRanksAndPolicyKnobs) {
  BudgetPolicy policy;
  policy.optimizer_share = 0;
  policy.node_reserve_fraction = 0;
  policy.node_reserve_min_bytes = 0;
  policy.rank_reserve_bytes = 0;
  const HostBudgets b = compute_host_budgets(two_by_four(), 2, policy);
  EXPECT_EQ(b.nodes[0].ranks, 2);
  EXPECT_EQ(b.nodes[1].ranks, 0);
  EXPECT_EQ(b.nodes[1].usable_bytes, 512 * GiB);  // reported, used by nobody
  for (const auto& r : b.ranks) {
    EXPECT_EQ(r.host_budget_bytes, 256 * GiB);
    EXPECT_EQ(r.optimizer_budget_bytes, 0u);
    EXPECT_EQ(r.sco_budget_bytes, 256 * GiB);
  }
}

TEST(HostBudget, SmallNodeGivesZeroNotAnUnderflow) {
  NodeTopology t = cpu_only();
  t.numa_nodes[0].memory_bytes = 3 * GiB;  // less than reserve + one rank's share
  const HostBudgets b = compute_host_budgets(t, 2);
  EXPECT_EQ(b.nodes[0].usable_bytes, 0u);
  for (const auto& r : b.ranks) {
    EXPECT_EQ(r.host_budget_bytes, 0u);
    EXPECT_EQ(r.sco_budget_bytes, 0u);
    EXPECT_EQ(r.optimizer_budget_bytes, 0u);
  }
}

TEST(HostBudget, BadPolicyIsAnError) {
  BudgetPolicy p;
  p.optimizer_share = 1.5;
  EXPECT_CONTAINS(error_of([&] { compute_host_budgets(cpu_only(), 1, p); }), "optimizer share");
  p = BudgetPolicy{};
  p.node_reserve_fraction = 1;
  EXPECT_CONTAINS(error_of([&] { compute_host_budgets(cpu_only(), 1, p); }), "reserve fraction");
}

}  // namespace
}  // namespace moepeak::topology
