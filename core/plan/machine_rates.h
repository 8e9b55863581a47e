// The rates the step-time model (core/plan/step_time.h) prices a step with, and where they come
// from (docs/plan.md#step-time):
//   - a GPU's public ceilings, named as defaults: device_rates("h100" | "h200"), each number with
//     its source in docs/plan.md (the datasheets' dense bf16 peak and HBM bandwidth, NVLink 4's
//     bandwidth, an NDR InfiniBand NIC per GPU, PCIe Gen5 x16), derated by the stated achieved
//     fractions (a large cuBLAS GEMM, FlashAttention, NCCL's all-to-all bus bandwidth);
//   - this machine measured (`moepeak probe` writes them into the probe file; the CPU's are
//     measured by core/measure/machine_measure.h);
// and the links between ranks: for the CPU backend every rank of the job shares one host, and
// runtime.cpu_link_gb_per_s / cpu_link_latency_us (the link model the CPU ranks run under) replace
// the host's shared-memory rate.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"
#include "core/plan/step_time.h"
#include "core/runtime/dtype.h"

namespace moepeak {

// The devices with documented defaults: "h100", "h200".
std::vector<std::string> default_devices();

// A device's defaults at the working dtype (bf16 tensor-core rates; f32 at the TF32 rate):
// 8 ranks per node (an HGX board), NVLink within it, one 400 Gb/s NIC per GPU between nodes.
// Throws moepeak::Error naming the known devices for another name.
MachineRates device_rates(std::string_view device, DType dtype);

// The links of CPU ranks on one host: every group within the node; the link model's rate and
// latency when runtime.cpu_link_gb_per_s is set, else `shared_memory_bytes_per_s`.
void set_cpu_links(MachineRates& rates, const RuntimeConfig& runtime, int world,
                   double shared_memory_bytes_per_s);

}  // namespace moepeak
