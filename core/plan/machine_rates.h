// The rates the step-time model (core/plan/step_time.h) prices a step with, and where they come
// from (docs/plan.md#step-time):
//   - a GPU's public ceilings, named as defaults: device_rates("h100" | "h200"), each number with
//     its source in docs/plan.md (the datasheets' dense bf16 peak and HBM bandwidth, NVLink 4's
//     bandwidth, an NDR InfiniBand NIC per GPU, PCIe Gen5 x16), derated by the stated achieved
//     fractions (a large cuBLAS GEMM, FlashAttention, NCCL's all-to-all bus bandwidth);
//   - this machine measured by `moepeak probe` at a config's shapes (core/measure/
//     machine_measure.h) and read back from the probe file's [rates]: rates_from_probe;
//   - (in `moepeak plan`, without either) this machine's CPU backend measured at plan time;
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
#include "topology/probe_file.h"

namespace moepeak {

// The devices with documented defaults: "h100", "h200".
std::vector<std::string> default_devices();

// A device's defaults at the working dtype (bf16 tensor-core rates; f32 at the TF32 rate):
// 8 ranks per node (an HGX board), NVLink within it, one 400 Gb/s NIC per GPU between nodes.
// Throws moepeak::Error naming the known devices for another name.
MachineRates device_rates(std::string_view device, DType dtype);

// The probe file's [rates] (`moepeak probe -o PATH`, docs/probe.md#step-time-rates) for a config
// whose runtime.backend is `runtime.backend` ("cuda", else the CPU: plan prices "auto" as the CPU)
// at `dtype`: named "this machine (PATH)", the source saying where, when and at which shapes they
// were measured; ranks_per_node = the probe's ranks_sharing; the links: the CPU's set_cpu_links
// rule, and on CUDA an H100's or H200's documented NVLink and network defaults when the probe's
// GPU is one (none otherwise: a step of more than one rank then fails naming the link's rate).
// Throws moepeak::Error naming the file, what it has, and the `moepeak probe` command that
// measures usable rates, when it has no [rates] or they are another backend's or dtype's.
MachineRates rates_from_probe(const topology::ProbeResult& probe, const std::string& path,
                              const RuntimeConfig& runtime, DType dtype);

// The message rates_from_probe would throw, or "" when the probe's rates fit: "PATH has no rates
// for f32 on cpu (it has bf16 on cpu; re-run `moepeak probe --cpu ... -o PATH` ...)".
std::string probe_rates_unusable(const topology::ProbeResult& probe, const std::string& path,
                                 const RuntimeConfig& runtime, DType dtype);

// The links of CPU ranks on one host: every group within the node; the link model's rate and
// latency when runtime.cpu_link_gb_per_s is set, else the host's shared memory: half its memcpy
// rate (rates.host_memory_bytes_per_s counts the read and the write).
void set_cpu_links(MachineRates& rates, const RuntimeConfig& runtime, int world);

}  // namespace moepeak
