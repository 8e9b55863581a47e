// OpenBLAS kernel selection (blas_kernels.h).
#include "core/runtime/blas_kernels.h"

#include <cblas.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

// NOTES: exported by OpenBLAS's DYNAMIC_ARCH builds (driver/others/dynamic.c): quit forgets the
// chosen kernel table, init chooses again (reading OPENBLAS_CORETYPE). Weak, so a single-target
// OpenBLAS, which has neither, links and keeps its kernels.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

// NOTES: exported by OpenBLAS's pthreads builds (driver/others/blas_server.c, openblas_env.c):
// read_env re-reads the OPENBLAS_* variables, shutdown joins the worker threads, init starts them
// again with the timeout read. Weak, for builds without them (OpenMP, single-threaded).
extern "C" {
void openblas_read_env(void) __attribute__((weak));
int blas_thread_shutdown_(void) __attribute__((weak));
int blas_thread_init(void) __attribute__((weak));
}

namespace moepeak {
namespace {

// OpenBLAS's x86-64 cores whose kernels use AVX2 and FMA (or better): a CPU detected as one of
// these was recognised.
constexpr std::array<std::string_view, 6> kAvx2Cores = {
    "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"};

std::string trimmed(const char* s) {
  std::string out = s != nullptr ? s : "";
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

BlasKernels select_once() {
  BlasKernels k;
  k.detected = trimmed(openblas_get_corename());
  k.active = k.detected;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  const bool avx2_fma = false, avx512 = false;
#endif
  const std::string want = preferred_blas_core(k.detected, avx2_fma, avx512);
  if (want.empty()) return k;
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user != nullptr) {
    k.note = "OPENBLAS_CORETYPE=" + std::string(user) + " kept";
    return k;
  }
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
    k.note = "this OpenBLAS cannot re-select its kernels (not a DYNAMIC_ARCH build)";
    return k;
  }
  setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  k.active = trimmed(openblas_get_corename());
  k.note = "OpenBLAS detected " + k.detected + " on a CPU with " + (avx512 ? "AVX-512" : "AVX2") +
           "; running its " + k.active + " kernels";
  return k;
}

// Shortens OpenBLAS's idle spin to 2^kBlasIdleSpinLog2 cycles unless the user set
// OPENBLAS_THREAD_TIMEOUT; returns what applies, for BlasKernels::idle.
std::string shorten_idle_spin() {
  if (const char* user = std::getenv("OPENBLAS_THREAD_TIMEOUT"); user != nullptr)
    return "OPENBLAS_THREAD_TIMEOUT=" + std::string(user) + " kept";
  if (openblas_read_env == nullptr || blas_thread_shutdown_ == nullptr ||
      blas_thread_init == nullptr)
    return "";
  setenv("OPENBLAS_THREAD_TIMEOUT", std::to_string(kBlasIdleSpinLog2).c_str(), 1);
  openblas_read_env();
  blas_thread_shutdown_();
  blas_thread_init();
  return "idle workers sleep after 2^" + std::to_string(kBlasIdleSpinLog2) + " cycles";
}

}  // namespace

std::string preferred_blas_core(const std::string& detected, bool avx2_fma, bool avx512) {
  for (std::string_view core : kAvx2Cores)
    if (detected == core) return "";
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

const BlasKernels& select_blas_kernels() {
  static std::once_flag once;
  static BlasKernels kernels;
  std::call_once(once, [] {
    kernels = select_once();
    kernels.idle = shorten_idle_spin();
  });
  return kernels;
}

}  // namespace moepeak
