// gpu_probe.h with the CUDA runtime and NCCL (compiled only with MOEPEAK_WITH_CUDA; plain C++ by
// the host compiler, no kernels). Any CUDA error means "no GPU" or a zero rate with the error
// named — the probe reports, it does not fail. Checked on a GPU machine with `moepeak probe`.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <string>

#include "topology/gpu_probe.h"

namespace moepeak::topology {
namespace {

std::string cuda_version_text(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string error_text(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CudaProbe probe_cuda() {
  CudaProbe p;
  p.compiled = true;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) p.runtime = cuda_version_text(v);
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) p.driver = cuda_version_text(v);
  if (ncclGetVersion(&v) == ncclSuccess) {
    p.nccl = std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
             std::to_string(v % 100);
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state for later callers
    p.status = "no GPU: " + error_text("cudaGetDeviceCount", e);
    return p;
  }
  if (count == 0) {
    p.status = "no GPU: the driver reports no CUDA device";
    return p;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if ((e = cudaGetDeviceProperties(&prop, d)) != cudaSuccess) {
      p.gpus.clear();
      p.status = "no GPU: " + error_text("cudaGetDeviceProperties", e);
      return p;
    }
    GpuInfo g;
    g.index = d;
    g.name = prop.name;
    g.memory_bytes = prop.totalGlobalMem;
    g.cc_major = prop.major;
    g.cc_minor = prop.minor;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), d) == cudaSuccess) g.bus_id = lower(bus);
    p.gpus.push_back(g);
  }
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      GpuLinkInfo l;
      l.a = a;
      l.b = b;
      int ab = 0, ba = 0, rank = -1;
      cudaDeviceCanAccessPeer(&ab, a, b);
      cudaDeviceCanAccessPeer(&ba, b, a);
      l.peer_access = ab && ba;
      if (l.peer_access &&
          cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a, b) == cudaSuccess) {
        l.perf_rank = rank;
      }
      p.links.push_back(l);
    }
  }
  cudaGetLastError();
  p.status = std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s");
  return p;
}

GpuCopyRates measure_gpu_copies(int device, void* host_src, void* host_dst, size_t bytes, bool pin,
                                int iters) {
  GpuCopyRates r;
  void* dev_a = nullptr;
  void* dev_b = nullptr;
  cudaStream_t s1 = nullptr, s2 = nullptr;
  bool reg_src = false, reg_dst = false;
  cudaError_t e = cudaSuccess;
  const char* call = "";
  auto step = [&](const char* what, cudaError_t status) {
    if (e == cudaSuccess && status != cudaSuccess) {
      e = status;
      call = what;
    }
    return e == cudaSuccess;
  };
  iters = std::max(1, iters);
  do {
    if (!step("cudaSetDevice", cudaSetDevice(device))) break;
    if (!step("cudaMalloc", cudaMalloc(&dev_a, bytes))) break;
    if (!step("cudaMalloc", cudaMalloc(&dev_b, bytes))) break;
    if (!step("cudaStreamCreate", cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking))) break;
    if (!step("cudaStreamCreate", cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking))) break;
    if (pin) {
      if (!step("cudaHostRegister", cudaHostRegister(host_src, bytes, cudaHostRegisterPortable)))
        break;
      reg_src = true;
      if (!step("cudaHostRegister", cudaHostRegister(host_dst, bytes, cudaHostRegisterPortable)))
        break;
      reg_dst = true;
    }
    auto submit = [&](bool h2d, bool d2h, int rounds) {
      for (int k = 0; k < rounds; ++k) {
        if (h2d && !step("cudaMemcpyAsync",
                         cudaMemcpyAsync(dev_a, host_src, bytes, cudaMemcpyHostToDevice, s1)))
          return false;
        if (d2h && !step("cudaMemcpyAsync",
                         cudaMemcpyAsync(host_dst, dev_b, bytes, cudaMemcpyDeviceToHost, s2)))
          return false;
      }
      return step("cudaStreamSynchronize", cudaStreamSynchronize(s1)) &&
             step("cudaStreamSynchronize", cudaStreamSynchronize(s2));
    };
    auto timed = [&](bool h2d, bool d2h) -> double {  // one warm-up copy, then `iters` timed
      if (!submit(h2d, d2h, 1)) return 0;
      auto t0 = std::chrono::steady_clock::now();
      if (!submit(h2d, d2h, iters)) return 0;
      const double moved = static_cast<double>(bytes) * iters * ((h2d ? 1 : 0) + (d2h ? 1 : 0));
      return moved / seconds_since(t0) / 1e9;
    };
    r.h2d = timed(true, false);
    r.d2h = timed(false, true);
    r.bidir = timed(true, true);
  } while (false);
  if (reg_src) cudaHostUnregister(host_src);
  if (reg_dst) cudaHostUnregister(host_dst);
  if (s1) cudaStreamDestroy(s1);
  if (s2) cudaStreamDestroy(s2);
  if (dev_a) cudaFree(dev_a);
  if (dev_b) cudaFree(dev_b);
  if (e != cudaSuccess) {
    cudaGetLastError();
    r = GpuCopyRates{};
    r.error = error_text(call, e);
  }
  return r;
}

double cuda_register_seconds(void* ptr, size_t bytes) {
  auto t0 = std::chrono::steady_clock::now();
  if (cudaHostRegister(ptr, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  const double s = seconds_since(t0);
  cudaHostUnregister(ptr);
  return s;
}

}  // namespace moepeak::topology
