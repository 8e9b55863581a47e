// OpenBLAS kernel selection (blas_kernels.h).
#include "core/runtime/blas_kernels.h"

#include <cblas.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string_view>

// NOTES: exported by OpenBLAS's DYNAMIC_ARCH builds (driver/others/dynamic.c): quit forgets the
// chosen kernel table, init chooses again (reading OPENBLAS_CORETYPE). Weak, so a single-target
// OpenBLAS, which has neither, links and keeps its kernels.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
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
  std::call_once(once, [] { kernels = select_once(); });
  return kernels;
}

}  // namespace moepeak
