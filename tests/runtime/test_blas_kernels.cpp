// OpenBLAS's kernel choice (core/runtime/blas_kernels.h): the pure rule for which core to force,
// and on this machine that select_blas_kernels() leaves OpenBLAS computing GEMMs right (against a
// float64 reference) with the kernels it reports. Run twice by ctest: as is, and with
// OPENBLAS_CORETYPE=Prescott, a user's choice that must be kept.
// Run: ctest -R test_blas_kernels --output-on-failure
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/runtime/blas_kernels.h"

namespace moepeak {
namespace {

TEST(BlasKernels, ForcesACoreOnlyWhenOpenBlasFellBackBelowTheCpu) {
  EXPECT_EQ(preferred_blas_core("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(preferred_blas_core("Prescott", true, false), "Haswell");
  EXPECT_EQ(preferred_blas_core("Nehalem", true, false), "Haswell");
  EXPECT_EQ(preferred_blas_core("Sandybridge", true, true), "SkylakeX");
  EXPECT_EQ(preferred_blas_core("Prescott", false, false), "");  // the CPU has no AVX2
  for (const char* recognised : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(preferred_blas_core(recognised, true, true), "") << recognised;
  }
}

std::string corename() {
  std::string s = openblas_get_corename();
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

TEST(BlasKernels, TheSelectedKernelsRunAndComputeGemmsRight) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string user_core = user != nullptr ? user : "";
  const BlasKernels& k = select_blas_kernels();
  EXPECT_EQ(&k, &select_blas_kernels());  // once per process
  EXPECT_EQ(k.active, corename());
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const std::string want = preferred_blas_core(k.detected, avx2, avx512);
  if (!user_core.empty() && !want.empty()) {
    EXPECT_EQ(k.active, k.detected) << "a user's OPENBLAS_CORETYPE was overridden";
    EXPECT_NE(k.note.find("kept"), std::string::npos) << k.note;
  } else if (!want.empty()) {
    EXPECT_EQ(k.active, want) << k.note;
    EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), want.c_str());
  } else {
    EXPECT_EQ(k.active, k.detected);
  }
  std::printf("OpenBLAS detected %s, runs %s%s%s\n", k.detected.c_str(), k.active.c_str(),
              k.note.empty() ? "" : ": ", k.note.c_str());

  // C (M, N) = A (M, K) B (K, N), f32, at a shape that takes the blocked kernel's edges.
  const int M = 67, N = 129, K = 83;
  std::vector<float> a(M * K), b(K * N), c(M * N, std::nanf(""));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 - 0.37);
  };
  for (float& v : a) v = next();
  for (float& v : b) v = next();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N,
              0.0f, c.data(), N);
  double worst = 0;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int p = 0; p < K; ++p) {
        ref += static_cast<double>(a[i * K + p]) * b[p * N + j];
        mag += std::abs(static_cast<double>(a[i * K + p]) * b[p * N + j]);
      }
      worst = std::max(worst, std::abs(c[i * N + j] - ref) / mag);
    }
  }
  // f32 accumulation over K = 83 products: a few units of 2^-24 of the magnitude sum.
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
}  // namespace moepeak
