// NodeTopology from this machine and from synthetic hwloc XML files (2 packages x 4 GPUs with
// NICs on package 1; a CPU-only node), the NUMA locality of GPUs and NICs, errors for unreadable
// topologies, and the host-link bench (rates > 0 only, never their size).
// Run: ctest -R test_topology
#include <gtest/gtest.h>

#include <sched.h>

#include <fstream>
#include <functional>
#include <thread>

#include "core/error.h"
#include "core/runtime/numa.h"
#include "core/units.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"
#include "tests/topology/topology_data.h"
#include "topology/binding.h"
#include "topology/host_budget.h"
#include "topology/host_link_bench.h"
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

TEST(ThisMachine, HwlocSeesNodesCoresAndMemory) {
  const NodeTopology t = load_this_machine();
  EXPECT_EQ(t.source, "this machine");
  EXPECT_FALSE(t.hostname.empty());
  ASSERT_GE(t.numa_nodes.size(), 1u);
  EXPECT_EQ(static_cast<int>(t.numa_nodes.size()), numa_node_count());
  EXPECT_GE(t.cores, 1);
  EXPECT_GE(t.pus, t.cores);
  int pus = 0;
  for (const auto& n : t.numa_nodes) {
    pus += n.pus;
    EXPECT_GT(n.memory_bytes, 0u);
    // hwloc and libnuma read the same per-node meminfo; neither need equal /proc/meminfo.
    const uint64_t libnuma = numa_node_memory(n.os_index).total_bytes;
    EXPECT_NEAR(static_cast<double>(n.memory_bytes), static_cast<double>(libnuma), 0.02 * libnuma);
    EXPECT_EQ(parse_index_list(n.cpus).size(), static_cast<size_t>(n.pus));
  }
  EXPECT_EQ(pus, t.pus);
  EXPECT_FALSE(t.gpu_status.empty());
  if (t.gpus.empty()) {
    EXPECT_EQ(t.gpu_status.rfind("no GPU", 0), 0u) << t.gpu_status;
    EXPECT_TRUE(t.gpu_links.empty());
  }
  for (const auto& g : t.gpus) EXPECT_GE(g.numa_node, 0) << "GPU " << g.index << " " << g.bus_id;
#ifndef MOEPEAK_WITH_CUDA
  EXPECT_TRUE(t.cuda_runtime.empty());
  EXPECT_TRUE(t.gpus.empty());
#endif
}

TEST(SyntheticTopology, TwoPackagesFourGpusEachNicsOnPackageOne) {
  const std::string path = topology_data("2pkg_4gpu.xml");
  const NodeTopology t = load_topology_xml(path);
  EXPECT_EQ(t.source, path);
  EXPECT_EQ(t.hostname, "synthetic-2x4");
  ASSERT_EQ(t.packages.size(), 2u);
  EXPECT_EQ(t.packages[1].cpu_model, "Synthetic CPU");
  EXPECT_EQ(t.packages[1].cores, 8);
  EXPECT_EQ(t.packages[1].pus, 16);
  EXPECT_EQ(t.cores, 16);
  EXPECT_EQ(t.pus, 32);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(t.numa_nodes[n].os_index, n);
    EXPECT_EQ(t.numa_nodes[n].package, n);
    EXPECT_EQ(t.numa_nodes[n].memory_bytes, 512 * GiB);
    EXPECT_EQ(t.numa_nodes[n].cores, 8);
    EXPECT_EQ(t.numa_nodes[n].pus, 16);
  }
  EXPECT_EQ(t.numa_nodes[0].cpus, "0-15");
  EXPECT_EQ(t.numa_nodes[1].cpus, "16-31");
  EXPECT_EQ(t.memory_bytes(), 1024 * GiB);

  ASSERT_EQ(t.pci_gpus.size(), 8u);
  EXPECT_TRUE(t.gpus.empty()) << "a topology file asks nothing of CUDA";
  EXPECT_EQ(t.gpu_count(), 8);
  for (int i = 0; i < 8; ++i) {
    const auto& g = t.pci_gpus[i];
    EXPECT_EQ(g.kind, PciKind::gpu);
    EXPECT_EQ(g.class_id, 0x0302);
    EXPECT_EQ(g.vendor_id, 0x10de);
    EXPECT_EQ(g.numa_node, i < 4 ? 0 : 1) << g.bus_id;
    EXPECT_EQ(t.gpu_numa_node(i), i < 4 ? 0 : 1);
    EXPECT_EQ(g.os_names, "cuda" + std::to_string(i));
  }
  EXPECT_EQ(t.pci_gpus[0].bus_id, "0000:18:00.0");
  EXPECT_EQ(t.pci_gpus[7].bus_id, "0000:db:00.0");

  ASSERT_EQ(t.nics.size(), 3u);
  EXPECT_EQ(t.nics[0].bus_id, "0000:05:00.0");
  EXPECT_EQ(t.nics[0].os_names, "eth0");
  EXPECT_EQ(t.nics[0].numa_node, 0);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(t.nics[i].kind, PciKind::nic);
    EXPECT_EQ(t.nics[i].class_id, 0x0207);
    EXPECT_EQ(t.nics[i].numa_node, 1) << t.nics[i].bus_id;
    EXPECT_EQ(t.nics[i].os_names, "mlx5_" + std::to_string(i - 1) + ",ib" + std::to_string(i - 1));
  }
  EXPECT_CONTAINS(t.gpu_status, "8 PCI GPUs");
}

TEST(SyntheticTopology, CpuOnlyNode) {
  const NodeTopology t = load_topology_xml(topology_data("1pkg_nogpu.xml"));
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes[0].memory_bytes, 64 * GiB);
  EXPECT_EQ(t.numa_nodes[0].cpus, "0-3");
  EXPECT_EQ(t.gpu_count(), 0);
  EXPECT_EQ(t.gpu_numa_node(0), -1);
  EXPECT_EQ(t.gpu_status, "no GPU in the topology file");
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].numa_node, 0);
}

TEST(SyntheticTopology, UnreadableFilesNameTheFile) {
  const std::string missing = topology_data("no-such-topology.xml");
  std::string e = error_of([&] { load_topology_xml(missing); });
  EXPECT_CONTAINS(e, "cannot read hwloc topology " + missing);
  EXPECT_CONTAINS(e, "No such file");

  const std::string garbage = topology_data("garbage.xml");
  e = error_of([&] { load_topology_xml(garbage); });
  EXPECT_CONTAINS(e, "cannot read hwloc topology " + garbage);
  EXPECT_CONTAINS(e, "not a valid hwloc XML export");

  test_support::TempDir dir;
  const std::string empty = (dir.path() / "empty.xml").string();
  std::ofstream(empty)
      << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology version=\"2.0\">\n</topology>\n";
  e = error_of([&] { load_topology_xml(empty); });
  EXPECT_CONTAINS(e, empty);

  e = error_of([&] { load_topology_xml(dir.path().string()); });  // a directory
  EXPECT_CONTAINS(e, dir.path().string());
}

TEST(IndexList, FormatsAndParsesRanges) {
  EXPECT_EQ(format_index_list({}), "");
  EXPECT_EQ(format_index_list({3}), "3");
  EXPECT_EQ(format_index_list({0, 1, 2, 3, 8, 9, 11}), "0-3,8-9,11");
  EXPECT_EQ(parse_index_list("0-3,8-9,11"), (std::vector<int>{0, 1, 2, 3, 8, 9, 11}));
  EXPECT_TRUE(parse_index_list("").empty());
  for (const char* bad : {"x", "1-", "3-1", "1,,2", "1,", "-1", "1 2"}) {
    EXPECT_CONTAINS(error_of([&] { parse_index_list(bad); }), "bad index list");
  }
}

TEST(HostLinkBench, MeasuresMemcpyAndPinningOnThisMachine) {
  const NodeTopology t = load_this_machine();
  const HostLinkBench b = run_host_link_bench(t, BenchOptions{8 * MiB, 2});
  EXPECT_EQ(b.bytes, 8 * MiB);
  int pinned = 0, pageable = 0;
  for (const auto& r : b.rows) {
    EXPECT_GT(r.gb_per_s, 0) << r.kind << " " << r.memory;
    EXPECT_EQ(r.bytes, 8 * MiB);
    if (r.kind == "memcpy") (r.memory == "pinned" ? pinned : pageable)++;
  }
  EXPECT_EQ(pinned, static_cast<int>(t.numa_nodes.size()));
  EXPECT_EQ(pageable, 1);
  EXPECT_GT(b.pinning.alloc_touch_s, 0);
  if (t.gpus.empty()) {
    EXPECT_EQ(b.pinning.cuda_register_s, -1);
    ASSERT_FALSE(b.notes.empty());
    EXPECT_CONTAINS(b.notes.back(), "no GPU");
  }
  EXPECT_CONTAINS(error_of([&] {
                    run_host_link_bench(t, BenchOptions{100, 1});
                  }),
                  "at least 4 KiB");
}

TEST(Binding, BindsAThreadToItsShareOfThisMachine) {
  const NodeTopology t = load_this_machine();
  const auto places = place_ranks(t, 1);
  std::string bound_cpus;
  std::vector<int> seen;
  std::string error;
  std::thread worker([&] {  // a fresh thread, so the test process keeps its affinity
    try {
      const BindResult b = bind_rank(places[0]);
      bound_cpus = b.cpus;
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof(set), &set);
      for (int i = 0; i < CPU_SETSIZE; ++i) {
        if (CPU_ISSET(i, &set)) seen.push_back(i);
      }
    } catch (const Error& e) {
      error = e.what();
    }
  });
  worker.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(bound_cpus, places[0].cpus);
  EXPECT_EQ(format_index_list(seen), places[0].cpus);

  RankPlacement none;
  none.cpus = "";
  EXPECT_CONTAINS(error_of([&] { bind_rank(none); }), "no PUs");
}

TEST(Binding, DecisionFollowsPolicyLauncherAndPuCount) {
  // auto: binds when the process may run on every PU and each rank gets at least one.
  EXPECT_TRUE(decide_binding(BindPolicy::automatic, 2, 16, 16).bind);
  EXPECT_TRUE(decide_binding(BindPolicy::automatic, 16, 16, 16).bind);
  const BindDecision launcher = decide_binding(BindPolicy::automatic, 2, 1, 16);
  EXPECT_FALSE(launcher.bind);
  EXPECT_CONTAINS(launcher.reason, "launcher bound it already (1 of 16 PUs");
  const BindDecision crowded = decide_binding(BindPolicy::automatic, 4, 2, 2);
  EXPECT_FALSE(crowded.bind);
  EXPECT_CONTAINS(crowded.reason, "4 ranks share 2 PUs");
  // rank: always; none: never, whatever the launcher did.
  EXPECT_TRUE(decide_binding(BindPolicy::rank, 4, 1, 2).bind);
  EXPECT_EQ(decide_binding(BindPolicy::rank, 4, 1, 2).reason, "");
  EXPECT_FALSE(decide_binding(BindPolicy::none, 1, 16, 16).bind);
  EXPECT_CONTAINS(decide_binding(BindPolicy::none, 1, 16, 16).reason, "runtime.bind = \"none\"");
}

TEST(Binding, TrainBindingBindsToTheProbedPlace) {
  Config cfg;
  cfg.runtime.bind = BindPolicy::rank;
  TrainBinding t;
  std::string error;
  std::thread worker([&] {  // a fresh thread keeps the test process's own affinity
    try {
      t = bind_for_training(cfg, 0, 0, 1, /*cpu_backend=*/true);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  worker.join();
  ASSERT_EQ(error, "");
  EXPECT_TRUE(t.bound);
  const auto places = place_ranks(load_this_machine(), 1);
  EXPECT_EQ(t.cpus, places[0].cpus);
  EXPECT_EQ(t.numa_node, places[0].numa_node);
  EXPECT_EQ(t.pus(), static_cast<int>(parse_index_list(places[0].cpus).size()));

  cfg.runtime.bind = BindPolicy::none;
  const TrainBinding n = bind_for_training(cfg, 0, 0, 1, true);
  EXPECT_FALSE(n.bound);
  EXPECT_GT(n.pus(), 0);  // what the process may run on, unchanged
}

}  // namespace
}  // namespace moepeak::topology
