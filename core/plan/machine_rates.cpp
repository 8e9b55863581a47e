// device_rates / set_cpu_links: the step-time model's rates (see machine_rates.h).
#include "core/plan/machine_rates.h"

#include "core/error.h"

namespace moepeak {
namespace {

// NOTES: each figure is a public ceiling (docs/plan.md#step-time names the datasheet) times an
// achieved fraction this file states; the fractions are assumptions until a GPU run calibrates
// them (issue: a probe file from `moepeak probe` on the node replaces every one).
constexpr double kTera = 1e12, kGiga = 1e9;
constexpr double kGemmFraction = 0.70;       // a large cuBLAS GEMM of the dense peak
constexpr double kGroupedFraction = 0.55;    // the experts' grouped GEMMs
constexpr double kAttentionFraction = 0.50;  // flash attention, forward and backward together
constexpr double kMemoryFraction = 0.85;     // HBM streaming
constexpr double kLinkFraction = 0.80;       // NCCL's bus bandwidth of the raw link
constexpr int kRanksPerNode = 8;             // an HGX board

struct Ceilings {
  double bf16_dense_flops, tf32_dense_flops, hbm_bytes_per_s;
};

}  // namespace

std::vector<std::string> default_devices() { return {"h100", "h200"}; }

MachineRates device_rates(std::string_view device, DType dtype) {
  Ceilings c{};
  MachineRates r;
  if (device == "h100") {
    c = {989 * kTera, 495 * kTera, 3350 * kGiga};  // H100 SXM5 datasheet
    r.name = "H100 SXM (public ceilings)";
  } else if (device == "h200") {
    c = {989 * kTera, 495 * kTera, 4800 * kGiga};  // H200 SXM datasheet
    r.name = "H200 SXM (public ceilings)";
  } else {
    MOEPEAK_INPUT_ERROR("no step-time defaults for device \"", device,
                        "\"; known: h100, h200 (or a probe file from `moepeak probe`)");
  }
  r.source = "defaults, docs/plan.md#step-time";
  const double peak = dtype == DType::bf16 ? c.bf16_dense_flops : c.tf32_dense_flops;
  r.peak_flops = peak;
  r.gemm_flops = kGemmFraction * peak;
  r.grouped_gemm_flops = kGroupedFraction * peak;
  r.attention_flops = kAttentionFraction * peak;
  r.memory_bytes_per_s = kMemoryFraction * c.hbm_bytes_per_s;
  r.host_link_bytes_per_s = 0.85 * 64 * kGiga;  // PCIe Gen5 x16, each way, pinned
  r.host_memory_bytes_per_s = 25 * kGiga;       // a rank's share of a 2-socket host's DRAM
  r.node_link_bytes_per_s = kLinkFraction * 450 * kGiga;  // NVLink 4: 900 GB/s both ways
  r.node_link_latency_s = 5e-6;
  r.network_bytes_per_s = kLinkFraction * 50 * kGiga;  // a 400 Gb/s NDR NIC per GPU
  r.network_latency_s = 10e-6;
  r.ranks_per_node = kRanksPerNode;
  return r;
}

void set_cpu_links(MachineRates& rates, const RuntimeConfig& runtime, int world,
                   double shared_memory_bytes_per_s) {
  rates.ranks_per_node = world;
  if (runtime.cpu_link_gb_per_s > 0) {
    rates.node_link_bytes_per_s = runtime.cpu_link_gb_per_s * kGiga;
    rates.node_link_latency_s = runtime.cpu_link_latency_us * 1e-6;
  } else {
    rates.node_link_bytes_per_s = shared_memory_bytes_per_s;
    rates.node_link_latency_s = 0;
  }
  rates.network_bytes_per_s = rates.node_link_bytes_per_s;
  rates.network_latency_s = rates.node_link_latency_s;
}

}  // namespace moepeak
