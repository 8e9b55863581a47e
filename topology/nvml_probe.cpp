// nvml_probe.h: the few NVML calls `moepeak probe` needs, declared here with NVML's C ABI
// (nvml.h of CUDA 12/13) and resolved with dlsym. Checked on GPU machines; here (no driver) the
// library is absent and the counts stay -1.
#include "topology/nvml_probe.h"

#include <dlfcn.h>

#include <cctype>
#include <cstring>
#include <string>

namespace moepeak::topology {
namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = void*;
constexpr unsigned kMaxNvLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper: 18)
struct nvmlPciInfo_t {                // nvmlPciInfo_st
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

std::string normalise_bus_id(const char* s) {  // "00000000:3B:00.0" -> "0000:3b:00.0"
  std::string id(s);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (id.size() == 16 && id.compare(0, 4, "0000") == 0) id = id.substr(4);  // 8-digit domain
  return id;
}

class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    init_ = reinterpret_cast<decltype(init_)>(dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<decltype(shutdown_)>(dlsym(lib_, "nvmlShutdown"));
    by_bus_ = reinterpret_cast<decltype(by_bus_)>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    link_state_ = reinterpret_cast<decltype(link_state_)>(dlsym(lib_, "nvmlDeviceGetNvLinkState"));
    remote_ =
        reinterpret_cast<decltype(remote_)>(dlsym(lib_, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
    driver_ = reinterpret_cast<decltype(driver_)>(dlsym(lib_, "nvmlSystemGetDriverVersion"));
    ok_ = init_ && shutdown_ && by_bus_ && link_state_ && remote_ && driver_ && init_() == 0;
  }
  ~Nvml() {
    if (ok_) shutdown_();
    if (lib_) dlclose(lib_);
  }
  bool ok() const { return ok_; }
  std::string driver_version() {
    char buf[96] = {0};
    return driver_(buf, sizeof(buf)) == 0 ? std::string(buf) : std::string("unknown");
  }
  // Remote bus ids of the active links of the GPU at `bus_id`; false when NVML cannot tell.
  bool active_links(const std::string& bus_id, std::vector<std::string>& remotes) {
    nvmlDevice_t dev = nullptr;
    if (by_bus_(bus_id.c_str(), &dev) != 0) return false;
    for (unsigned l = 0; l < kMaxNvLinks; ++l) {
      int active = 0;
      if (link_state_(dev, l, &active) != 0 || !active) continue;
      nvmlPciInfo_t pci;
      std::memset(&pci, 0, sizeof(pci));
      remotes.push_back(remote_(dev, l, &pci) == 0 ? normalise_bus_id(pci.busId) : std::string());
    }
    return true;
  }

 private:
  void* lib_ = nullptr;
  bool ok_ = false;
  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  nvmlReturn_t (*by_bus_)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*link_state_)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*driver_)(char*, unsigned) = nullptr;
};

}  // namespace

std::string fill_nvlinks(std::vector<GpuInfo>& gpus, std::vector<GpuLinkInfo>& links) {
  Nvml nvml;
  if (!nvml.ok()) return "";
  std::vector<std::vector<std::string>> remotes(gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (nvml.active_links(gpus[i].bus_id, remotes[i]))
      gpus[i].nvlinks = static_cast<int>(remotes[i].size());
  }
  for (auto& l : links) {
    if (gpus[l.a].nvlinks < 0) continue;
    int n = 0;
    for (const auto& r : remotes[l.a]) n += r == gpus[l.b].bus_id;
    l.nvlinks = n;
  }
  return nvml.driver_version();
}

}  // namespace moepeak::topology
