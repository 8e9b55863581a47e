// NVLink counts from NVML, loaded at run time (dlopen("libnvidia-ml.so.1")) so that moepeak needs
// neither NVML's header nor its library to build and runs where the driver is absent. Plain C++,
// compiled in every build. Without the library every count stays -1 ("unknown").
#pragma once

#include <string>
#include <vector>

#include "topology/node_topology.h"

namespace moepeak::topology {

// Fills gpus[i].nvlinks (active links of each GPU) and links[j].nvlinks (active links whose remote
// end is the other GPU of the pair; 0 when they meet through NVSwitches) by PCI bus id; returns
// NVML's driver version, or "" when NVML is absent or fails. Never throws.
std::string fill_nvlinks(std::vector<GpuInfo>& gpus, std::vector<GpuLinkInfo>& links);

}  // namespace moepeak::topology
