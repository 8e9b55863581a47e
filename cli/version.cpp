// `moepeak --version`: what was built (version, git sha, compiler, CUDA compiled in or not) and
// what the libraries report at run time (MPI, OpenBLAS, hwloc, libnuma, CUDA runtime / driver,
// NCCL). Needs neither MPI_Init nor a GPU.
#include <cstdio>

#include "cli/build_info.h"
#include "cli/commands.h"

namespace moepeak::cli {

void print_version() {
  const BuildInfo& b = build_info();
  std::printf("moepeak %s (git %s, %s, %s)\n", b.version.c_str(), b.git_sha.c_str(),
              b.build_type.c_str(), b.compiler.c_str());
  if (b.cuda_compiled) {
    std::printf("CUDA backend: compiled in (nvcc %s, NCCL %s headers)\n",
                b.cuda_compiled_version.c_str(), b.nccl_compiled_version.c_str());
  } else {
    std::printf("CUDA backend: not compiled in (CPU backend only)\n");
  }
  for (const auto& [name, version] : runtime_library_versions()) {
    std::printf("  %-13s %s\n", name.c_str(), version.c_str());
  }
}

}  // namespace moepeak::cli
