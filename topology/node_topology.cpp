// node_topology.h with hwloc 2 (I/O objects kept so PCI GPUs and NICs appear with their locality),
// the CUDA runtime through gpu_probe.h and NVML through nvml_probe.h.
// Tests: ctest -R test_topology.
#include "topology/node_topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "topology/gpu_probe.h"
#include "topology/nvml_probe.h"

namespace moepeak::topology {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

// This machine (xml_path null) or an hwloc XML export.
TopologyPtr open_topology(const std::string* xml_path) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    MOEPEAK_THROW("hwloc: hwloc_topology_init failed: ", std::strerror(errno));
  TopologyPtr topo(raw);
  // NOTES: hwloc 2 drops I/O objects by default; KEEP_IMPORTANT keeps GPUs, NICs and the bridges
  // above them (enough for locality), not every PCI function.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xml_path) {
    const std::string& path = *xml_path;
    std::ifstream probe(path);
    if (!probe)
      MOEPEAK_INPUT_ERROR("cannot read hwloc topology ", path, ": ", std::strerror(errno));
    // NOTES: hwloc parses the file in set_xml already; a bad file fails there or at load.
    if (hwloc_topology_set_xml(raw, path.c_str()) != 0 || hwloc_topology_load(raw) != 0) {
      MOEPEAK_INPUT_ERROR("cannot read hwloc topology ", path,
                          ": not a valid hwloc XML export (write one with `lstopo --of xml "
                          "FILE`)");
    }
    const int pus = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU);
    const int nodes = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
    if (pus <= 0 || nodes <= 0) {
      MOEPEAK_INPUT_ERROR("hwloc topology ", path, " has ", pus, " PUs and ", nodes,
                          " NUMA nodes; a node needs at least one of each");
    }
  } else if (hwloc_topology_load(raw) != 0) {
    MOEPEAK_THROW("hwloc: cannot load the topology of this machine: ", std::strerror(errno));
  }
  return topo;
}

std::vector<int> cpuset_indexes(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (!set) return out;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) { out.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  return out;
}

int count_inside(hwloc_topology_t t, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
  return set ? hwloc_get_nbobjs_inside_cpuset_by_type(t, set, type) : 0;
}

// The one NUMA node a set of nodes names, or -1 for none or several.
int single_node(hwloc_const_nodeset_t set) {
  return set && hwloc_bitmap_weight(set) == 1 ? hwloc_bitmap_first(set) : -1;
}

PciKind classify(uint16_t class_id, uint16_t vendor) {
  if (class_id == 0x0302 || (class_id == 0x0300 && vendor == 0x10de)) return PciKind::gpu;
  if ((class_id >> 8) == 0x02) return PciKind::nic;
  return PciKind::other;
}

void read_hwloc(hwloc_topology_t t, NodeTopology& out) {
  hwloc_obj_t root = hwloc_get_root_obj(t);
  if (const char* host = hwloc_obj_get_info_by_name(root, "HostName")) out.hostname = host;
  out.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  out.pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  if (out.cores <= 0) out.cores = out.pus;  // some VMs expose no Core objects

  for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PACKAGE, p));) {
    PackageInfo pk;
    pk.os_index = static_cast<int>(p->os_index);
    if (const char* model = hwloc_obj_get_info_by_name(p, "CPUModel")) pk.cpu_model = model;
    pk.cores = count_inside(t, p->cpuset, HWLOC_OBJ_CORE);
    pk.pus = count_inside(t, p->cpuset, HWLOC_OBJ_PU);
    out.packages.push_back(pk);
  }
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n));) {
    NumaNodeInfo nn;
    nn.os_index = static_cast<int>(n->os_index);
    if (hwloc_obj_t pk = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, n))
      nn.package = static_cast<int>(pk->os_index);
    nn.memory_bytes = n->attr ? n->attr->numanode.local_memory : 0;
    nn.cpus = format_index_list(cpuset_indexes(n->cpuset));
    nn.cores = count_inside(t, n->cpuset, HWLOC_OBJ_CORE);
    nn.pus = count_inside(t, n->cpuset, HWLOC_OBJ_PU);
    if (nn.cores == 0) nn.cores = nn.pus;
    out.numa_nodes.push_back(nn);
  }
  std::sort(out.numa_nodes.begin(), out.numa_nodes.end(),
            [](const NumaNodeInfo& a, const NumaNodeInfo& b) { return a.os_index < b.os_index; });

  for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(t, d));) {
    const auto& a = d->attr->pcidev;
    PciDeviceInfo pci;
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%01x", a.domain, a.bus, a.dev, a.func);
    pci.bus_id = bus;
    pci.class_id = a.class_id;
    pci.vendor_id = a.vendor_id;
    pci.device_id = a.device_id;
    pci.kind = classify(a.class_id, a.vendor_id);
    if (pci.kind == PciKind::other) continue;
    for (hwloc_obj_t c = d->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      if (!pci.os_names.empty()) pci.os_names += ",";
      pci.os_names += c->name;
    }
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(t, d);
    pci.numa_node = local ? single_node(local->nodeset) : -1;
    (pci.kind == PciKind::gpu ? out.pci_gpus : out.nics).push_back(pci);
  }
  auto by_bus = [](const PciDeviceInfo& a, const PciDeviceInfo& b) { return a.bus_id < b.bus_id; };
  std::sort(out.pci_gpus.begin(), out.pci_gpus.end(), by_bus);
  std::sort(out.nics.begin(), out.nics.end(), by_bus);
}

// NUMA node of a PCI device from sysfs (when hwloc filtered it out); -1 when unknown.
int sysfs_numa_node(const std::string& bus_id) {
  std::ifstream in("/sys/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

}  // namespace

const char* pci_kind_name(PciKind kind) {
  switch (kind) {
    case PciKind::gpu:
      return "gpu";
    case PciKind::nic:
      return "nic";
    case PciKind::other:
      return "other";
  }
  return "other";
}

int NodeTopology::gpu_numa_node(int i) const {
  if (!gpus.empty()) return i >= 0 && i < static_cast<int>(gpus.size()) ? gpus[i].numa_node : -1;
  return i >= 0 && i < static_cast<int>(pci_gpus.size()) ? pci_gpus[i].numa_node : -1;
}

const NumaNodeInfo* NodeTopology::numa_node(int os_index) const {
  for (const auto& n : numa_nodes) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

uint64_t NodeTopology::memory_bytes() const {
  uint64_t total = 0;
  for (const auto& n : numa_nodes) total += n.memory_bytes;
  return total;
}

std::string format_index_list(const std::vector<int>& indexes) {
  std::string out;
  for (size_t i = 0; i < indexes.size();) {
    size_t j = i;
    while (j + 1 < indexes.size() && indexes[j + 1] == indexes[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(indexes[i]);
    if (j > i) out += "-" + std::to_string(indexes[j]);
    i = j + 1;
  }
  return out;
}

NodeTopology load_this_machine() {
  NodeTopology out;
  out.source = "this machine";
  {
    TopologyPtr topo = open_topology(nullptr);
    read_hwloc(topo.get(), out);
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) out.hostname = host;

  CudaProbe cuda = probe_cuda();
  out.gpu_status = cuda.status;
  out.cuda_driver = cuda.driver;
  out.cuda_runtime = cuda.runtime;
  out.nccl = cuda.nccl;
  out.gpus = std::move(cuda.gpus);
  out.gpu_links = std::move(cuda.links);
  for (auto& g : out.gpus) {
    for (const auto& p : out.pci_gpus) {
      if (p.bus_id == g.bus_id) g.numa_node = p.numa_node;
    }
    if (g.numa_node < 0) g.numa_node = sysfs_numa_node(g.bus_id);
    if (g.numa_node < 0 && out.numa_nodes.size() == 1) g.numa_node = out.numa_nodes[0].os_index;
  }
  if (!out.gpus.empty()) out.nvml = fill_nvlinks(out.gpus, out.gpu_links);
  return out;
}

NodeTopology load_topology_xml(const std::string& path) {
  NodeTopology out;
  out.source = path;
  TopologyPtr topo = open_topology(&path);
  read_hwloc(topo.get(), out);
  out.gpu_status = out.pci_gpus.empty() ? "no GPU in the topology file"
                                        : std::to_string(out.pci_gpus.size()) + " PCI GPU" +
                                              (out.pci_gpus.size() == 1 ? "" : "s") +
                                              " in the topology file (CUDA not asked)";
  return out;
}

}  // namespace moepeak::topology
