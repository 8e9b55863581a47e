// gemm_tiles: bf16-storage GEMM with fp32 arithmetic on the CPU (see ops/cpu/gemm_tiles.h): the
// tile planner, the widen/round loops (scalar and AVX2, bitwise the same), and the tile loops
// around OpenBLAS sgemm. Test: ctest -R test_gemm_bf16
#include "ops/cpu/gemm_tiles.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOEPEAK_GEMM_TILES_AVX2 1
#define MOEPEAK_AVX2 __attribute__((target("avx2")))
#endif

namespace moepeak::ops {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- widen (bf16 -> fp32, exact) and round (fp32 -> bf16, nearest even) ----------------------

void widen_scalar(const bf16* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
}

// c[i] = bf16(cf[i] (+ float(c[i]))): the one rounding of a bf16 output.
void round_scalar(const float* cf, bf16* c, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    c[i] = bf16(accumulate ? cf[i] + static_cast<float>(c[i]) : cf[i]);
  }
}

#ifdef MOEPEAK_GEMM_TILES_AVX2
MOEPEAK_AVX2 void widen_avx2(const bf16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 8), hi);
  }
  // NOTES: clear the upper halves of the ymm registers before the scalar (SSE-encoded) tail: GCC
  // emits no vzeroupper before a tail call, and SSE code after dirty upper state runs several
  // times slower (every later expf, mulss, ... of the thread; a bf16 step measured 9x slower).
  _mm256_zeroupper();
  widen_scalar(s + i, d + i, n - i);
}

// bf16::from_float (core/runtime/dtype.h) on 8 lanes: (u + 0x7fff + lsb) >> 16, and a NaN
// keeps its sign and top mantissa bits with the quiet bit set.
MOEPEAK_AVX2 __m128i to_bf16_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i top = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
  // Every lane is <= 0xffff, so the unsigned saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

MOEPEAK_AVX2 void round_avx2(const float* cf, bf16* c, int64_t n, bool accumulate) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(cf + i);
    if (accumulate) {
      const __m128i old = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i));
      x = _mm256_add_ps(x, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(old), 16)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i), to_bf16_avx2(x));
  }
  _mm256_zeroupper();  // as in widen_avx2
  round_scalar(cf + i, c + i, n - i, accumulate);
}
#endif

bool use_avx2() {
#ifdef MOEPEAK_GEMM_TILES_AVX2
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

// dst (rows, cols), dense, = src[r * ld + c] widened.
void widen_block(const bf16* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  const bool simd = use_avx2();
  for (int64_t r = 0; r < rows; ++r) {
#ifdef MOEPEAK_GEMM_TILES_AVX2
    if (simd) {
      widen_avx2(src + r * ld, dst + r * cols, cols);
      continue;
    }
#endif
    (void)simd;
    widen_scalar(src + r * ld, dst + r * cols, cols);
  }
}

// c (rows, cols) with leading dimension ldc = round(cf (+ c)), cf dense (rows, cols).
void round_block(const float* cf, int64_t rows, int64_t cols, bf16* c, int64_t ldc,
                 bool accumulate) {
  const bool simd = use_avx2();
  for (int64_t r = 0; r < rows; ++r) {
#ifdef MOEPEAK_GEMM_TILES_AVX2
    if (simd) {
      round_avx2(cf + r * cols, c + r * ldc, cols, accumulate);
      continue;
    }
#endif
    (void)simd;
    round_scalar(cf + r * cols, c + r * ldc, cols, accumulate);
  }
}

// ---- the planner --------------------------------------------------------------------------------

using Order = GemmTilePlan::Order;

// Relative costs, in element copies (widening one element, or OpenBLAS packing one): an sgemm
// call's fixed cost (OpenBLAS hands the call to its threads and waits), and one fp32 pass over
// the C tile (read and write) for each inner panel after the first. Rough: on the 2-core bench
// machine plans within a few percent of this model's choice time the same within noise.
constexpr double kCallCost = 40000;
constexpr double kCPassCost = 2;

// Tile extents worth trying for an extent n: n itself and 64, 128, ... below it, each balanced
// (n cut into ceil(n / cap) tiles of equal size up to one) so no tile is a sliver.
int candidates(int64_t n, int64_t* out) {
  int count = 0;
  out[count++] = n;
  for (int64_t cap = 64; cap < n; cap *= 2) out[count++] = ceil_div(n, ceil_div(n, cap));
  return count;
}

double plan_cost(int64_t M, int64_t N, int64_t K, const GemmTilePlan& p) {
  const double tm = static_cast<double>(ceil_div(M, p.mc));
  const double tn = static_cast<double>(ceil_div(N, p.nc));
  const double tk = static_cast<double>(ceil_div(K, p.kc));
  const double a = static_cast<double>(M) * static_cast<double>(K);
  const double b = static_cast<double>(K) * static_cast<double>(N);
  const double c = static_cast<double>(M) * static_cast<double>(N);
  const double widen_a = p.order == Order::a_panel ? a : a * tn;
  const double widen_b = p.order == Order::b_panel ? b : b * tm;
  const double packs = a * tn + b * tm;  // OpenBLAS packs both operands of every call
  return widen_a + widen_b + packs + kCPassCost * c * (tk - 1) + kCallCost * tm * tn * tk;
}

}  // namespace

GemmTilePlan gemm_tile_plan(int64_t rows, int64_t cols, int64_t inner, bool bf16_c) {
  int64_t ms[64], ns[64], ks[64];
  const int cm = candidates(rows, ms), cn = candidates(cols, ns), ck = candidates(inner, ks);
  GemmTilePlan best;
  double best_cost = -1;
  for (Order order : {Order::b_panel, Order::a_panel, Order::c_tile}) {
    for (int i = 0; i < cm; ++i) {
      for (int j = 0; j < cn; ++j) {
        for (int l = 0; l < ck; ++l) {
          GemmTilePlan p{order, ms[i], ns[j], ks[l]};
          if (p.scratch_floats(bf16_c) > kGemmTileScratchFloats) continue;
          // A bf16 C is rounded once, so outside c_tile its tile must see all of `inner` at once.
          if (bf16_c && order != Order::c_tile && p.kc != inner) continue;
          const double cost = plan_cost(rows, cols, inner, p);
          if (best_cost < 0 || cost < best_cost) {
            best = p;
            best_cost = cost;
          }
        }
      }
    }
  }
  if (best_cost < 0) best = GemmTilePlan{Order::c_tile, 64, 64, 64};  // unreachable: always fits
  best.mc = std::min(best.mc, rows);
  best.nc = std::min(best.nc, cols);
  best.kc = std::min(best.kc, inner);
  return best;
}

namespace {

struct Problem {
  bool trans_a, trans_b;
  int64_t rows, cols, inner;
  const bf16* a;
  int64_t lda;
  const bf16* b;
  int64_t ldb;
  bool accumulate;
};

// op(A)[i0 : i0 + m, p0 : p0 + k] into af, dense in A's own orientation; returns sgemm's lda.
int64_t widen_a(const Problem& q, int64_t i0, int64_t m, int64_t p0, int64_t k, float* af) {
  if (!q.trans_a) {
    widen_block(q.a + i0 * q.lda + p0, q.lda, m, k, af);
    return k;
  }
  widen_block(q.a + p0 * q.lda + i0, q.lda, k, m, af);
  return m;
}

// op(B)[p0 : p0 + k, j0 : j0 + n] into bf, dense in B's own orientation; returns sgemm's ldb.
int64_t widen_b(const Problem& q, int64_t p0, int64_t k, int64_t j0, int64_t n, float* bf) {
  if (!q.trans_b) {
    widen_block(q.b + p0 * q.ldb + j0, q.ldb, k, n, bf);
    return n;
  }
  widen_block(q.b + j0 * q.ldb + p0, q.ldb, n, k, bf);
  return k;
}

void sgemm(const Problem& q, int64_t m, int64_t n, int64_t k, const float* af, int64_t la,
           const float* bf, int64_t lb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, q.trans_a ? CblasTrans : CblasNoTrans,
              q.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, af, static_cast<blasint>(la),
              bf, static_cast<blasint>(lb), beta, c, static_cast<blasint>(ldc));
}

// The thread's scratch (kGemmTileScratchFloats, 64-byte aligned), allocated on first use and
// freed when the thread ends.
float* thread_scratch() {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  static_assert(kGemmTileScratchBytes % 64 == 0);
  thread_local std::unique_ptr<float, Free> scratch(
      static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(kGemmTileScratchBytes))));
  MOEPEAK_CHECK(scratch != nullptr, "gemm_bf16: cannot allocate ", kGemmTileScratchBytes,
                " bytes of tile scratch");
  return scratch.get();
}

template <typename TC>
void run(const Problem& q, const GemmTilePlan& p, TC* c, int64_t ldc) {
  float* const af = thread_scratch();
  float* const bf = af + p.mc * p.kc;
  float* const cf = bf + p.kc * p.nc;  // bf16 C only
  const int64_t M = q.rows, N = q.cols, K = q.inner;
  // The product of the widened tiles into C's tile (i0, j0), inner panel p0.
  auto product = [&](int64_t i0, int64_t m, int64_t j0, int64_t n, int64_t p0, int64_t k,
                     int64_t la, int64_t lb) {
    if constexpr (std::is_same_v<TC, float>) {
      const float beta = p0 == 0 && !q.accumulate ? 0.0f : 1.0f;
      sgemm(q, m, n, k, af, la, bf, lb, beta, c + i0 * ldc + j0, ldc);
    } else {
      sgemm(q, m, n, k, af, la, bf, lb, p0 == 0 ? 0.0f : 1.0f, cf, n);
      if (p0 + k == K) round_block(cf, m, n, c + i0 * ldc + j0, ldc, q.accumulate);
    }
  };
  switch (p.order) {
    case Order::b_panel:
      for (int64_t j0 = 0; j0 < N; j0 += p.nc) {
        const int64_t n = std::min(p.nc, N - j0);
        for (int64_t p0 = 0; p0 < K; p0 += p.kc) {
          const int64_t k = std::min(p.kc, K - p0);
          const int64_t lb = widen_b(q, p0, k, j0, n, bf);
          for (int64_t i0 = 0; i0 < M; i0 += p.mc) {
            const int64_t m = std::min(p.mc, M - i0);
            product(i0, m, j0, n, p0, k, widen_a(q, i0, m, p0, k, af), lb);
          }
        }
      }
      break;
    case Order::a_panel:
      for (int64_t i0 = 0; i0 < M; i0 += p.mc) {
        const int64_t m = std::min(p.mc, M - i0);
        for (int64_t p0 = 0; p0 < K; p0 += p.kc) {
          const int64_t k = std::min(p.kc, K - p0);
          const int64_t la = widen_a(q, i0, m, p0, k, af);
          for (int64_t j0 = 0; j0 < N; j0 += p.nc) {
            const int64_t n = std::min(p.nc, N - j0);
            product(i0, m, j0, n, p0, k, la, widen_b(q, p0, k, j0, n, bf));
          }
        }
      }
      break;
    case Order::c_tile:
      for (int64_t i0 = 0; i0 < M; i0 += p.mc) {
        const int64_t m = std::min(p.mc, M - i0);
        for (int64_t j0 = 0; j0 < N; j0 += p.nc) {
          const int64_t n = std::min(p.nc, N - j0);
          for (int64_t p0 = 0; p0 < K; p0 += p.kc) {
            const int64_t k = std::min(p.kc, K - p0);
            const int64_t la = widen_a(q, i0, m, p0, k, af);
            product(i0, m, j0, n, p0, k, la, widen_b(q, p0, k, j0, n, bf));
          }
        }
      }
      break;
  }
}

template <typename TC>
void gemm_any(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const bf16* a,
              int64_t lda, const bf16* b, int64_t ldb, bool accumulate, TC* c, int64_t ldc,
              const GemmTilePlan* plan) {
  constexpr bool bf16_c = std::is_same_v<TC, bf16>;
  if (plan != nullptr) {
    MOEPEAK_CHECK(plan->mc >= 1 && plan->nc >= 1 && plan->kc >= 1 &&
                      plan->scratch_floats(bf16_c) <= kGemmTileScratchFloats &&
                      (!bf16_c || plan->order == GemmTilePlan::Order::c_tile || plan->kc >= inner),
                  "gemm_bf16: tile plan ", plan->mc, " x ", plan->nc, " x ", plan->kc,
                  " does not fit the scratch or cannot round a bf16 C once");
  }
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    if (accumulate) return;
    for (int64_t i = 0; i < rows; ++i) std::fill(c + i * ldc, c + i * ldc + cols, TC(0.0f));
    return;
  }
  const Problem q{trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate};
  run(q, plan != nullptr ? *plan : gemm_tile_plan(rows, cols, inner, bf16_c), c, ldc);
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, bool accumulate, bf16* c, int64_t ldc,
               const GemmTilePlan* plan) {
  gemm_any(trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate, c, ldc, plan);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, bool accumulate, float* c, int64_t ldc,
               const GemmTilePlan* plan) {
  gemm_any(trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate, c, ldc, plan);
}

}  // namespace moepeak::ops
