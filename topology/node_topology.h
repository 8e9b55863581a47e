// NodeTopology: what one node has — packages, NUMA nodes with their local memory, cores/PUs, PCI
// GPUs and NICs with the NUMA node each is attached to (hwloc), and, when the CUDA backend is
// compiled in and a driver answers, the CUDA devices, their peer access and NVLinks (CUDA runtime,
// NVML loaded at run time) and the CUDA/NCCL versions. `moepeak probe` prints it and writes it to
// the probe file (topology/probe_file.h).
//
//   NodeTopology t = load_this_machine();                   // hwloc + CUDA + NVML
//   NodeTopology x = load_topology_xml("tests/.../2x4.xml"); // hwloc XML only (no CUDA)
//
// A machine without a GPU (or without a driver) is a normal case: `gpus` is empty and
// `gpu_status` says why. Tests: ctest -R test_topology (synthetic XML topologies in
// tests/topology/data/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moepeak::topology {

struct PackageInfo {
  int os_index = 0;
  std::string cpu_model;  // hwloc's CPUModel info, "" when unknown
  int cores = 0;
  int pus = 0;
  bool operator==(const PackageInfo&) const = default;
};

struct NumaNodeInfo {
  int os_index = 0;
  int package = -1;           // os_index of the package holding it, -1 when none (e.g. CXL memory)
  uint64_t memory_bytes = 0;  // local memory as hwloc reports it for this node
  std::string cpus;           // PU os indexes as a list: "0-3,8-11" ("" for a memory-only node)
  int cores = 0;
  int pus = 0;
  bool operator==(const NumaNodeInfo&) const = default;
};

enum class PciKind { gpu, nic, other };

// A PCI device hwloc sees. GPU = class 0x0302 (3D controller), or 0x0300 (VGA) from NVIDIA;
// NIC = class 0x02xx (0x0200 Ethernet, 0x0207 InfiniBand).
struct PciDeviceInfo {
  std::string bus_id;      // "0000:3b:00.0" (lower case, as hwloc and sysfs write it)
  uint16_t class_id = 0;   // 0x0302
  uint16_t vendor_id = 0;  // 0x10de
  uint16_t device_id = 0;
  PciKind kind = PciKind::other;
  std::string os_names;  // hwloc OS devices below it, comma-separated: "mlx5_0,ib0", "cuda0"
  int numa_node = -1;    // os_index of its local NUMA node; -1 when hwloc cannot tell
  bool operator==(const PciDeviceInfo&) const = default;
};

// A CUDA device (only filled from the CUDA runtime of a build with CUDA, on a machine with a
// driver).
struct GpuInfo {
  int index = 0;     // CUDA device ordinal
  std::string name;  // "NVIDIA H200"
  uint64_t memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  std::string bus_id;  // lower-case PCI bus id "0000:3b:00.0"
  int numa_node = -1;  // from hwloc's PCI locality (or sysfs); -1 unknown
  int nvlinks = -1;    // active NVLinks (NVML); -1 when NVML is absent
  bool operator==(const GpuInfo&) const = default;
};

// One ordered pair of CUDA devices (a < b).
struct GpuLinkInfo {
  int a = 0, b = 0;
  bool peer_access = false;  // cudaDeviceCanAccessPeer both ways
  int perf_rank = -1;        // cudaDevP2PAttrPerformanceRank (lower is faster), -1 without access
  int nvlinks = -1;          // direct NVLinks between the two (NVML); 0 via NVSwitch; -1 no NVML
  bool operator==(const GpuLinkInfo&) const = default;
};

struct NodeTopology {
  std::string hostname;
  std::string source;  // "this machine" or the XML file it was loaded from
  std::vector<PackageInfo> packages;
  std::vector<NumaNodeInfo> numa_nodes;  // ordered by os_index
  int cores = 0;
  int pus = 0;
  std::vector<PciDeviceInfo> pci_gpus;  // GPUs as PCI devices (hwloc), ordered by bus id
  std::vector<PciDeviceInfo> nics;
  std::vector<GpuInfo> gpus;  // CUDA devices; empty without CUDA, driver or device
  std::vector<GpuLinkInfo> gpu_links;
  std::string gpu_status;    // "2 CUDA devices", "no GPU: ...", "CUDA not compiled in"
  std::string cuda_driver;   // "13.0", "" when none
  std::string cuda_runtime;  // "13.0", "" when not compiled in
  std::string nccl;          // "2.28.9", "" when not compiled in
  std::string nvml;          // NVML driver version, "" when libnvidia-ml.so.1 is absent

  // The NUMA node local to GPU slot i (CUDA devices when present, else PCI GPUs); -1 unknown.
  int gpu_count() const {
    return gpus.empty() ? static_cast<int>(pci_gpus.size()) : static_cast<int>(gpus.size());
  }
  int gpu_numa_node(int i) const;
  const NumaNodeInfo* numa_node(int os_index) const;  // nullptr when there is no such node
  uint64_t memory_bytes() const;                      // sum over NUMA nodes
  bool operator==(const NodeTopology&) const = default;
};

const char* pci_kind_name(PciKind kind);  // "gpu", "nic", "other"

// hwloc on this machine (I/O devices included), then the CUDA devices (a build with CUDA; any CUDA
// error means "no GPU", said in gpu_status), peer access and NVLinks, versions.
// Throws moepeak::Error when hwloc cannot load the topology.
NodeTopology load_this_machine();

// An hwloc XML export (`lstopo --of xml`, `hwloc-gather-topology`), for other machines and tests.
// GPUs are the PCI GPUs of the file; nothing is asked of CUDA. Throws moepeak::Error naming the
// file when it cannot be read or is not a topology.
NodeTopology load_topology_xml(const std::string& path);

// "0-3,8-11" from a sorted list of indexes.
std::string format_index_list(const std::vector<int>& indexes);

}  // namespace moepeak::topology
