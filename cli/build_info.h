// What this binary was built from and what it runs on: `moepeak --version` prints it.
#pragma once

#include <string>
#include <vector>

namespace moepeak {

struct BuildInfo {
  std::string version;     // project version, e.g. "0.1.0"
  std::string git_sha;     // short sha at configure time, or "unknown"
  std::string build_type;  // CMake build type
  std::string compiler;    // "GNU 12.2.0"
  bool cuda_compiled = false;
  std::string cuda_compiled_version;  // nvcc version the CUDA backend was built with, if any
  std::string nccl_compiled_version;
};

const BuildInfo& build_info();

// (name, version) pairs of the libraries as they report themselves at run time: MPI library,
// OpenBLAS, hwloc, libnuma, toml++, spdlog, fmt, and with CUDA compiled in the CUDA runtime,
// driver (or "no driver") and NCCL.
std::vector<std::pair<std::string, std::string>> runtime_library_versions();

}  // namespace moepeak
