// device_rates / rates_from_probe / set_cpu_links: the step-time model's rates (see
// machine_rates.h).
#include "core/plan/machine_rates.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "core/error.h"

namespace moepeak {
namespace {

// NOTES: each figure is a public ceiling (docs/plan.md#step-time names the datasheet) times an
// achieved fraction this file states; the fractions are assumptions until a GPU run calibrates
// them (a probe file's [rates] from `moepeak probe` on the node, rates_from_probe, replaces all
// but the links).
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
  // A GPU's elementwise kernels and its loss stream HBM (their exponentials are cheap there).
  r.elementwise_bytes_per_s = r.loss_bytes_per_s = r.memory_bytes_per_s;
  r.host_link_bytes_per_s = 0.85 * 64 * kGiga;  // PCIe Gen5 x16, each way, pinned
  r.host_memory_bytes_per_s = 25 * kGiga;       // a rank's share of a 2-socket host's DRAM
  r.node_link_bytes_per_s = kLinkFraction * 450 * kGiga;  // NVLink 4: 900 GB/s both ways
  r.node_link_latency_s = 5e-6;
  r.network_bytes_per_s = kLinkFraction * 50 * kGiga;  // a 400 Gb/s NDR NIC per GPU
  r.network_latency_s = 10e-6;
  r.ranks_per_node = kRanksPerNode;
  return r;
}

namespace {

std::string_view backend_of(const RuntimeConfig& runtime) {
  return runtime.backend == BackendChoice::cuda ? "cuda" : "cpu";
}

}  // namespace

std::string probe_rates_unusable(const topology::ProbeResult& probe, const std::string& path,
                                 const RuntimeConfig& runtime, DType dtype) {
  const std::string_view backend = backend_of(runtime), want = dtype_name(dtype);
  const topology::ProbeRates& x = probe.rates;
  if (probe.rates_measured && x.backend == backend && x.dtype == want) return "";
  const std::string has = !probe.rates_measured
                              ? "it has none: written with --no-bench or --topology-xml, or by "
                                "a moepeak before the probe measured them"
                              : "it has " + x.dtype + " on " + x.backend;
  const int ranks = std::max(1, probe.budgets.ranks_per_node);
  return fmt::format(
      "{} has no rates for {} on {} ({}; re-run `moepeak probe{} -n {} --set training.dtype={} "
      "-o {}` with this config's -c/--set on the node)",
      path, want, backend, has, backend == "cpu" ? " --cpu" : "", ranks,
      dtype == DType::bf16 ? "bfloat16" : "float32", path);
}

MachineRates rates_from_probe(const topology::ProbeResult& probe, const std::string& path,
                              const RuntimeConfig& runtime, DType dtype) {
  const std::string unusable = probe_rates_unusable(probe, path, runtime, dtype);
  if (!unusable.empty()) MOEPEAK_INPUT_ERROR(unusable);
  const topology::ProbeRates& x = probe.rates;
  MachineRates r;
  r.name = "this machine (" + path + ")";
  r.source =
      fmt::format("{} {}, measured by `moepeak probe` on {}, {}, at {}; a rank of {} on the node",
                  x.backend, x.dtype, probe.host, probe.date, x.shapes, x.ranks_sharing);
  r.gemm_flops = x.gemm_flops;
  r.grouped_gemm_flops = x.grouped_gemm_flops;
  r.attention_flops = x.attention_flops;
  r.memory_bytes_per_s = x.memory_bytes_per_s;
  r.elementwise_bytes_per_s = x.elementwise_bytes_per_s;
  r.loss_bytes_per_s = x.loss_bytes_per_s;
  r.host_link_bytes_per_s = x.host_link_bytes_per_s;
  r.host_memory_bytes_per_s = x.host_memory_bytes_per_s;
  r.op_latency_s = x.op_latency_s;
  r.peak_flops = x.peak_flops;
  if (x.backend == "cpu") {
    set_cpu_links(r, runtime, x.ranks_sharing);
  } else {
    // NOTES: the probe measures no link between GPUs; an H100's or H200's documented ones stand in.
    for (const std::string& d : default_devices()) {
      std::string upper = d;
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (x.device.find(upper) == std::string::npos) continue;
      const MachineRates links = device_rates(d, dtype);
      r.node_link_bytes_per_s = links.node_link_bytes_per_s;
      r.node_link_latency_s = links.node_link_latency_s;
      r.network_bytes_per_s = links.network_bytes_per_s;
      r.network_latency_s = links.network_latency_s;
      r.source += "; links: " + links.name + " defaults";
      break;
    }
  }
  r.ranks_per_node = x.ranks_sharing;
  return r;
}

void set_cpu_links(MachineRates& rates, const RuntimeConfig& runtime, int world) {
  rates.ranks_per_node = world;
  if (runtime.cpu_link_gb_per_s > 0) {
    rates.node_link_bytes_per_s = runtime.cpu_link_gb_per_s * kGiga;
    rates.node_link_latency_s = runtime.cpu_link_latency_us * 1e-6;
  } else {
    rates.node_link_bytes_per_s = rates.host_memory_bytes_per_s / 2;
    rates.node_link_latency_s = 0;
  }
  rates.network_bytes_per_s = rates.node_link_bytes_per_s;
  rates.network_latency_s = rates.node_link_latency_s;
}

}  // namespace moepeak
