// The emulated cuBLASLt and cuBLAS (cublas.cpp) against a naive reference in long double (at
// least float64): cublasLtMatmul over storage types x transposes x beta x odd shapes and padded
// leading dimensions, the grouped GEMM of ops/cuda/grouped_linear.cpp, bf16 rounding, and the
// statuses of bad calls.
//
// "Device" memory is host memory (the emulated device shares the address space); GEMMs are queued
// on the legacy default stream and run at cudaStreamSynchronize(nullptr).
//
// Tolerance of one output, with S = |alpha| sum_p |op(A)(i,p) op(B)(p,j)| + |beta C(i,j)| and
// ref the exact (float64) value:
//   |D - ref| <= (k + 2) u S (1 + u_out) + u_out |ref|
// u is the compute type's unit roundoff (2^-24 for fp32, 2^-53 for fp64): a sum of k products
// accumulated in order errs by at most about k u S, and alpha, beta and the last add add two more
// roundings. u_out is 2^-8 for a bf16 output (its 8-bit significand, rounded once) and 0
// otherwise (an fp32/fp64 output is the accumulator itself). The inputs are exact in their
// storage type, so the reference sees the same operands.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_emulation/stream_order.h"

namespace {

double bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

size_t size_of(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : t == CUDA_R_32F ? 4 : 8; }

// A column-major (rows, cols) matrix with leading dimension ld in "device" memory (8-byte aligned
// host memory).
class Matrix {
 public:
  Matrix(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld)
      : type_(type),
        rows_(rows),
        cols_(cols),
        ld_(ld),
        words_((static_cast<size_t>(ld * std::max<int64_t>(cols, 1)) * size_of(type) + 7) / 8) {}

  void* data() { return words_.data(); }
  int64_t ld() const { return ld_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  double get(int64_t i, int64_t j) const { return get_at(i + j * ld_); }
  double get_at(int64_t at) const {
    const char* p = reinterpret_cast<const char*>(words_.data()) + at * size_of(type_);
    if (type_ == CUDA_R_16BF) {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      return bf16_value(bits);
    }
    if (type_ == CUDA_R_32F) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  // Stores v, which must be exact in the type (or NaN).
  void set_at(int64_t at, double v) {
    char* p = reinterpret_cast<char*>(words_.data()) + at * size_of(type_);
    const float f = static_cast<float>(v);
    if (type_ == CUDA_R_16BF) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t bits = std::isnan(f) ? 0x7fc0 : static_cast<uint16_t>(u >> 16);
      std::memcpy(p, &bits, 2);
    } else if (type_ == CUDA_R_32F) {
      std::memcpy(p, &f, 4);
    } else {
      std::memcpy(p, &v, 8);
    }
    EXPECT_TRUE(std::isnan(v) || get_at(at) == v) << v << " is not exact in the type";
  }
  // Every element (padding rows included) from `next`, the padding rows set to `pad`.
  template <typename Next>
  void fill(Next&& next, double pad) {
    for (int64_t j = 0; j < cols_; ++j) {
      for (int64_t i = 0; i < ld_; ++i) set_at(i + j * ld_, i < rows_ ? next() : pad);
    }
  }

 private:
  cudaDataType_t type_;
  int64_t rows_, cols_, ld_;
  std::vector<uint64_t> words_;
};

// Random values exact in `type`: 8 significant bits for bf16, a float or double in [-1, 1) else.
struct Values {
  std::mt19937_64 rng{12345};
  cudaDataType_t type;
  double operator()() {
    if (type == CUDA_R_16BF) return static_cast<double>(static_cast<int>(rng() % 257) - 128) / 64;
    const double v = std::uniform_real_distribution<double>(-1, 1)(rng);
    return type == CUDA_R_32F ? static_cast<double>(static_cast<float>(v)) : v;
  }
};

// The largest power of two (at most 256) dividing the address, as ops/cuda/cublaslt.cpp computes.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 1;
  while (a < 256 && v % (2 * a) == 0) a *= 2;
  return a;
}

void sync() { ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess); }

// Largest error seen, in units of the bound and of u S, per storage configuration.
struct ErrorStats {
  int cases = 0;
  double worst_of_bound = 0;  // max |D - ref| / bound
  double worst_abs = 0;       // max |D - ref|
};

// Checks D (m, n) against the reference and the padding rows of D against `pad`.
void expect_matches(const Matrix& d, const Matrix& a, bool ta, const Matrix& b, bool tb,
                    const std::vector<double>& c0, int64_t ldc, double alpha, double beta,
                    int64_t m, int64_t n, int64_t k, double u, double u_out, double pad,
                    ErrorStats* stats) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < d.ld(); ++i) {
      if (i >= m) {
        ASSERT_EQ(d.get(i, j), pad) << "padding row " << i << " of column " << j << " changed";
        continue;
      }
      // In long double (at least float64; x86's 64-bit significand keeps f64 results honest).
      long double ref = 0, s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const long double x = ta ? a.get(p, i) : a.get(i, p), y = tb ? b.get(j, p) : b.get(p, j);
        ref += x * y;
        s += std::fabs(x * y);
      }
      ref *= alpha;
      s *= std::fabs(alpha);
      if (beta != 0) {
        ref += beta * static_cast<long double>(c0[i + j * ldc]);
        s += std::fabs(beta * static_cast<long double>(c0[i + j * ldc]));
      }
      const double got = d.get(i, j);
      const double err = static_cast<double>(std::fabs(got - ref));
      const double bound =
          static_cast<double>((k + 2) * u * s * (1 + u_out) + u_out * std::fabs(ref));
      ASSERT_TRUE(err <= bound) << "D(" << i << ", " << j << ") = " << got << ", reference " << ref
                                << ", error " << err << " > bound " << bound;
      stats->worst_abs = std::max(stats->worst_abs, err);
      if (bound > 0) stats->worst_of_bound = std::max(stats->worst_of_bound, err / bound);
    }
  }
}

struct Storage {
  const char* name;
  cudaDataType_t ab, cd;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  double u, u_out;
};

const Storage kStorages[] = {
    {"bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, 0x1p-24, 0x1p-8},
    {"bf16->f32", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 0x1p-24, 0},
    {"f32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 0x1p-24, 0},
    {"f64", CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, 0x1p-53, 0},
};

const cublasOperation_t kOps[] = {CUBLAS_OP_N, CUBLAS_OP_T};

// Descriptors of one matmul, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  }
};

class CublasLt : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  void TearDown() override { EXPECT_EQ(cublasLtDestroy(handle_), CUBLAS_STATUS_SUCCESS); }

  // The descriptors and heuristic as ops/cuda/cublaslt.cpp makes them (alignments of the real
  // pointers), then cublasLtMatmul on the null stream. Returns the first status that is not
  // success.
  cublasStatus_t matmul(const Storage& st, cublasOperation_t ta, cublasOperation_t tb, Matrix& a,
                        Matrix& b, Matrix& c, Matrix& d, const void* alpha, const void* beta) {
    LtCall l;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    auto step = [&s](cublasStatus_t r) {
      if (s == CUBLAS_STATUS_SUCCESS) s = r;
    };
    step(cublasLtMatmulDescCreate(&l.desc, st.compute, st.scale));
    step(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    step(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    step(cublasLtMatrixLayoutCreate(&l.a, st.ab, a.rows(), a.cols(), a.ld()));
    step(cublasLtMatrixLayoutCreate(&l.b, st.ab, b.rows(), b.cols(), b.ld()));
    step(cublasLtMatrixLayoutCreate(&l.c, st.cd, c.rows(), c.cols(), c.ld()));
    step(cublasLtMatrixLayoutCreate(&l.d, st.cd, d.rows(), d.cols(), d.ld()));
    step(cublasLtMatmulPreferenceCreate(&l.pref));
    const uint64_t workspace = 32ull << 20;
    step(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace, sizeof workspace));
    const void* ptrs[] = {a.data(), b.data(), c.data(), d.data()};
    const cublasLtMatmulPreferenceAttributes_t attrs[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      const uint32_t bytes = alignment_of(ptrs[i]);
      step(cublasLtMatmulPreferenceSetAttribute(l.pref, attrs[i], &bytes, sizeof bytes));
    }
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    cublasLtMatmulHeuristicResult_t results[8]{};
    int found = -1;
    s = cublasLtMatmulAlgoGetHeuristic(handle_, l.desc, l.a, l.b, l.c, l.d, l.pref, 8, results,
                                       &found);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    EXPECT_EQ(found, 1);
    EXPECT_EQ(results[0].state, CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(results[0].workspaceSize, 0u);
    return cublasLtMatmul(handle_, l.desc, alpha, a.data(), l.a, b.data(), l.b, beta, c.data(), l.c,
                          d.data(), l.d, &results[0].algo, nullptr, 0, nullptr);
  }

  cublasLtHandle_t handle_ = nullptr;
};

TEST_F(CublasLt, MatchesFloat64Reference) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},  {1, 3, 17}, {3, 17, 33}, {17, 33, 1},
                          {33, 1, 3}, {5, 7, 0},  {16, 8, 64}};
  constexpr double kPad = -7.25;  // exact in every type; padding rows must keep it
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Storage& st : kStorages) {
    ErrorStats stats;
    Values ab{std::mt19937_64(1), st.ab}, cd{std::mt19937_64(2), st.cd};
    for (const Shape& sh : shapes) {
      for (cublasOperation_t ta : kOps) {
        for (cublasOperation_t tb : kOps) {
          for (double beta : {0.0, 1.0}) {
            for (int variant = 0; variant < 2; ++variant) {  // 0: tight ld, D == C; 1: padded, D
              const int64_t pad = variant == 0 ? 0 : 3;
              const bool in_place = variant == 0;
              const double alpha = variant == 0 ? 1.0 : -0.75;
              const int64_t m = sh.m, n = sh.n, k = sh.k;
              SCOPED_TRACE(std::string(st.name) + " m " + std::to_string(m) + " n " +
                           std::to_string(n) + " k " + std::to_string(k) + " op " +
                           std::to_string(ta) + std::to_string(tb) + " beta " +
                           std::to_string(beta) + " variant " + std::to_string(variant));
              const int64_t ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
              const int64_t br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
              Matrix a(st.ab, ar, ac, std::max<int64_t>(ar + pad, 1));
              Matrix b(st.ab, br, bc, std::max<int64_t>(br + pad, 1));
              Matrix c(st.cd, m, n, m + pad), d_sep(st.cd, m, n, m + 2 * pad + 1);
              a.fill(ab, kPad);
              b.fill(ab, kPad);
              // beta == 0: C is NaN (cuBLAS must not read it).
              c.fill([&] { return beta == 0 ? nan : cd(); }, kPad);
              d_sep.fill([&] { return nan; }, kPad);
              std::vector<double> c0(static_cast<size_t>(c.ld() * n));
              for (int64_t at = 0; at < c.ld() * n; ++at) c0[at] = c.get_at(at);
              Matrix& d = in_place ? c : d_sep;
              const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
              const bool f64 = st.scale == CUDA_R_64F;
              ASSERT_EQ(
                  matmul(st, ta, tb, a, b, c, d, f64 ? static_cast<const void*>(&alpha) : &alpha_f,
                         f64 ? static_cast<const void*>(&beta) : &beta_f),
                  CUBLAS_STATUS_SUCCESS);
              sync();
              expect_matches(d, a, ta != CUBLAS_OP_N, b, tb != CUBLAS_OP_N, c0, c.ld(), alpha, beta,
                             m, n, k, st.u, st.u_out, kPad, &stats);
              if (!in_place) {  // C is an input only
                for (int64_t at = 0; at < c.ld() * n; ++at) {
                  const double v = c.get_at(at);
                  ASSERT_TRUE(v == c0[at] || (std::isnan(v) && std::isnan(c0[at])));
                }
              }
              ++stats.cases;
            }
          }
        }
      }
    }
    std::printf("[ cuBLASLt %-9s ] %d cases, max error %.3g = %.3g of the bound\n", st.name,
                stats.cases, stats.worst_abs, stats.worst_of_bound);
  }
}

// alpha and beta are read during the call (host pointer mode), not when the GEMM runs.
TEST_F(CublasLt, ReadsAlphaAndBetaAtTheCall) {
  const Storage& st = kStorages[2];  // f32
  Matrix a(CUDA_R_32F, 1, 1, 1), b(CUDA_R_32F, 1, 1, 1), c(CUDA_R_32F, 1, 1, 1);
  a.set_at(0, 3);
  b.set_at(0, 5);
  c.set_at(0, 7);
  float alpha = 2, beta = 1;
  ASSERT_EQ(matmul(st, CUBLAS_OP_N, CUBLAS_OP_N, a, b, c, c, &alpha, &beta), CUBLAS_STATUS_SUCCESS);
  alpha = 100;
  beta = 100;
  sync();
  EXPECT_EQ(c.get_at(0), 2 * 15 + 7);
}

// bf16 output: round to nearest even once, NaN stays NaN, overflow to infinity.
TEST_F(CublasLt, RoundsBf16OutputToNearestEven) {
  const Storage& st = kStorages[0];
  struct Case {
    double a, b, c, want;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {0x1p-8, 1, 1, 1},                    // 1 + 2^-8: a tie, to the even 1
      {0x3p-8, 1, 1, 1 + 0x1p-6},           // 1 + 3 2^-8: a tie, to the even 1 + 2^-6
      {0x1p-8, 1 + 0x1p-7, 1, 1 + 0x1p-7},  // 1 + 2^-8 + 2^-15: above the tie, up
      {0x1.fep127, 2, 0, inf},              // past the largest bf16
      {std::numeric_limits<double>::quiet_NaN(), 1, 1, std::numeric_limits<double>::quiet_NaN()},
  };
  for (const Case& cs : cases) {
    Matrix a(CUDA_R_16BF, 1, 1, 1), b(CUDA_R_16BF, 1, 1, 1), c(CUDA_R_16BF, 1, 1, 1);
    a.set_at(0, cs.a);
    b.set_at(0, cs.b);
    c.set_at(0, cs.c);
    const float alpha = 1, beta = 1;
    ASSERT_EQ(matmul(st, CUBLAS_OP_N, CUBLAS_OP_N, a, b, c, c, &alpha, &beta),
              CUBLAS_STATUS_SUCCESS);
    sync();
    if (std::isnan(cs.want)) {
      EXPECT_TRUE(std::isnan(c.get_at(0)));
    } else {
      EXPECT_EQ(c.get_at(0), cs.want) << "a " << cs.a;
    }
  }
}

TEST_F(CublasLt, RejectsBadCalls) {
  cublasLtMatrixLayout_t layout = nullptr;
  // ld below the rows.
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 2, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(layout, nullptr);

  // f64-sized buffers: room for any of the types the calls below name.
  Matrix a(CUDA_R_64F, 4, 4, 4), b(CUDA_R_64F, 4, 4, 4), c(CUDA_R_64F, 4, 4, 4);
  const double one = 1;
  const float one_f = 1;
  // bf16 with CUBLAS_COMPUTE_64F: no such combination.
  const Storage bf16_f64{"", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_64F, CUDA_R_64F, 0, 0};
  EXPECT_EQ(matmul(bf16_f64, CUBLAS_OP_N, CUBLAS_OP_N, a, b, c, c, &one, &one),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // fp32 compute with a double scale type.
  const Storage f32_scale64{"", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_64F, 0, 0};
  EXPECT_EQ(matmul(f32_scale64, CUBLAS_OP_N, CUBLAS_OP_N, a, b, c, c, &one, &one),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // TF32 and f16 are not emulated.
  const Storage tf32{"", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, 0, 0};
  EXPECT_EQ(matmul(tf32, CUBLAS_OP_N, CUBLAS_OP_N, a, b, c, c, &one_f, &one_f),
            CUBLAS_STATUS_NOT_SUPPORTED);

  // Shapes that disagree: op(A) (4, 4) with B (3, 4).
  Matrix b3(CUDA_R_64F, 3, 4, 4);
  EXPECT_EQ(matmul(kStorages[0], CUBLAS_OP_N, CUBLAS_OP_N, a, b3, c, c, &one_f, &one_f),
            CUBLAS_STATUS_INVALID_VALUE);

  // A pointer less aligned than the heuristic was told (the default, 256 bytes).
  LtCall l;
  ASSERT_EQ(cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l.a, CUDA_R_32F, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&l.pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, l.desc, l.a, l.a, l.a, l.a, l.pref, 1, &result,
                                           &found),
            CUBLAS_STATUS_SUCCESS);
  alignas(256) float buf[16] = {};
  EXPECT_EQ(cublasLtMatmul(handle_, l.desc, &one_f, buf, l.a, buf + 4, l.a, &one_f, buf + 8, l.a,
                           buf + 8, l.a, &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // The same call without an algorithm runs (cuBLASLt chooses one itself).
  EXPECT_EQ(cublasLtMatmul(handle_, l.desc, &one_f, buf, l.a, buf + 4, l.a, &one_f, buf + 8, l.a,
                           buf + 8, l.a, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  // A zeroed algorithm is none the heuristic returned.
  const cublasLtMatmulAlgo_t zero{};
  EXPECT_EQ(cublasLtMatmul(handle_, l.desc, &one_f, buf, l.a, buf, l.a, &one_f, buf + 8, l.a,
                           buf + 8, l.a, &zero, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  sync();

  // Null handle and descriptors; an attribute of the wrong size.
  EXPECT_EQ(cublasLtMatmul(nullptr, l.desc, &one_f, buf, l.a, buf, l.a, &one_f, buf, l.a, buf, l.a,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmul(handle_, nullptr, &one_f, buf, l.a, buf, l.a, &one_f, buf, l.a, buf, l.a,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(handle_, l.desc, &one_f, buf, nullptr, buf, l.a, &one_f, buf, l.a, buf,
                           l.a, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  const int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
            CUBLAS_STATUS_INVALID_VALUE);
  const cublasOperation_t bogus = static_cast<cublasOperation_t>(7);
  EXPECT_EQ(
      cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSB, &bogus, sizeof bogus),
      CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasStatus, NamesAndStrings) {
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
               "the functionality requested is not supported");
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED),
               "the GPU program failed to execute");
}

// ---- cuBLAS: the handle and the grouped GEMM ---------------------------------------------------

TEST(Cublas, HandleKeepsStreamWorkspaceAndMathMode) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(&h);  // any value: the handle only keeps it
  cudaStream_t got = s;
  ASSERT_EQ(cublasGetStream(h, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, nullptr);  // the legacy default stream until set
  ASSERT_EQ(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetStream(h, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, s);
  alignas(256) static char workspace[1024];
  EXPECT_EQ(cublasSetWorkspace(h, workspace, sizeof workspace), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSetWorkspace(h, workspace + 16, 512), CUBLAS_STATUS_INVALID_VALUE);
  const auto mode = static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  EXPECT_EQ(cublasSetMathMode(h, mode), CUBLAS_STATUS_SUCCESS);
  cublasMath_t got_mode = CUBLAS_TF32_TENSOR_OP_MATH;
  EXPECT_EQ(cublasGetMathMode(h, &got_mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got_mode, mode);
  EXPECT_EQ(cublasSetMathMode(h, static_cast<cublasMath_t>(9)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetStream(nullptr, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

// Three groups of different m (the second of two GEMMs), as ops/cuda/grouped_linear.cpp calls it
// but with mixed transposes, betas and alphas. The pointer arrays are "device" memory written by
// work queued before the call (as grouped_linear's cudaMemcpyAsync is): they hold nulls when the
// call is made. The host arrays are overwritten after the call (they are read during it).
TEST(Cublas, GroupedBatchedMatchesFloat64Reference) {
  const Storage* storages[] = {&kStorages[0], &kStorages[2], &kStorages[3]};
  for (const Storage* st : storages) {
    SCOPED_TRACE(st->name);
    constexpr int kGroups = 3;
    std::vector<cublasOperation_t> ta = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_N};
    std::vector<cublasOperation_t> tb = {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_OP_N};
    std::vector<int> m = {5, 17, 2}, n = {7, 7, 3}, k = {33, 1, 16}, size = {1, 2, 1};
    std::vector<double> alpha = {1, 1, -0.5}, beta = {0, 1, 1};
    std::vector<int> lda(kGroups), ldb(kGroups), ldc(kGroups);
    std::vector<float> alpha_f(alpha.begin(), alpha.end()), beta_f(beta.begin(), beta.end());
    std::vector<Matrix> as, bs, cs;
    std::vector<std::vector<double>> c0s;
    std::vector<int> group_of;
    Values ab{std::mt19937_64(3), st->ab};
    constexpr double kPad = -7.25;
    for (int g = 0; g < kGroups; ++g) {
      const int ar = ta[g] == CUBLAS_OP_N ? m[g] : k[g], ac = ta[g] == CUBLAS_OP_N ? k[g] : m[g];
      const int br = tb[g] == CUBLAS_OP_N ? k[g] : n[g], bc = tb[g] == CUBLAS_OP_N ? n[g] : k[g];
      lda[g] = ar + 1;
      ldb[g] = br + 2;
      ldc[g] = m[g] + g;
      for (int i = 0; i < size[g]; ++i) {
        as.emplace_back(st->ab, ar, ac, lda[g]);
        bs.emplace_back(st->ab, br, bc, ldb[g]);
        cs.emplace_back(st->cd, m[g], n[g], ldc[g]);
        as.back().fill(ab, kPad);
        bs.back().fill(ab, kPad);
        const double nan = std::numeric_limits<double>::quiet_NaN();
        cs.back().fill([&] { return beta[g] == 0 ? nan : ab(); }, kPad);
        std::vector<double> c0(static_cast<size_t>(ldc[g] * n[g]));
        for (size_t at = 0; at < c0.size(); ++at) c0[at] = cs.back().get_at(at);
        c0s.push_back(std::move(c0));
        group_of.push_back(g);
      }
    }
    const size_t count = as.size();
    std::vector<const void*> a_ptrs(count), b_ptrs(count);
    std::vector<void*> c_ptrs(count);
    ASSERT_EQ(moepeak::cuda_emulation::enqueue(nullptr, "test: write the pointer arrays",
                                               [&] {
                                                 for (size_t i = 0; i < count; ++i) {
                                                   a_ptrs[i] = as[i].data();
                                                   b_ptrs[i] = bs[i].data();
                                                   c_ptrs[i] = cs[i].data();
                                                 }
                                               }),
              cudaSuccess);
    cublasHandle_t h = nullptr;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const bool f64 = st->compute == CUBLAS_COMPUTE_64F;
    ASSERT_EQ(cublasGemmGroupedBatchedEx(
                  h, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                  f64 ? static_cast<const void*>(alpha.data()) : alpha_f.data(), a_ptrs.data(),
                  st->ab, lda.data(), b_ptrs.data(), st->ab, ldb.data(),
                  f64 ? static_cast<const void*>(beta.data()) : beta_f.data(), c_ptrs.data(),
                  st->cd, ldc.data(), kGroups, size.data(), st->compute),
              CUBLAS_STATUS_SUCCESS);
    std::vector<int> m_host = m;  // the call's sizes; the arrays it was given are now garbage
    std::fill(m.begin(), m.end(), -1);
    std::fill(alpha_f.begin(), alpha_f.end(), 1e30f);
    std::fill(alpha.begin(), alpha.end(), 1e300);
    sync();
    ErrorStats stats;
    std::vector<double> alpha_real = {1, 1, -0.5};
    for (size_t i = 0; i < count; ++i) {
      const int g = group_of[i];
      SCOPED_TRACE("GEMM " + std::to_string(i) + " of group " + std::to_string(g));
      expect_matches(cs[i], as[i], ta[g] != CUBLAS_OP_N, bs[i], tb[g] != CUBLAS_OP_N, c0s[i],
                     ldc[g], alpha_real[g], beta[g], m_host[g], n[g], k[g], st->u, st->u_out, kPad,
                     &stats);
    }
    std::printf("[ grouped %-9s ] %zu GEMMs, max error %.3g = %.3g of the bound\n", st->name, count,
                stats.worst_abs, stats.worst_of_bound);
    EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  }
}

TEST(Cublas, GroupedBatchedRejectsBadCalls) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t n_op = CUBLAS_OP_N;
  const int four = 4, three = 3, minus = -1, one_group = 1;
  const float one = 1;
  float a_buf[16] = {}, b_buf[16] = {}, c_buf[16] = {};
  const void* a[] = {a_buf};
  const void* b[] = {b_buf};
  void* c[] = {c_buf};
  auto call = [&](const int* m, const int* lda, cudaDataType_t type, cublasComputeType_t compute) {
    return cublasGemmGroupedBatchedEx(h, &n_op, &n_op, m, &four, &four, &one, a, type, lda, b, type,
                                      &four, &one, c, type, &four, 1, &one_group, compute);
  };
  EXPECT_EQ(call(&four, &three, CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&minus, &four, CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&four, &four, CUDA_R_16BF, CUBLAS_COMPUTE_64F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(&four, &four, CUDA_R_16F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_NOT_SUPPORTED);
  // The grouped GEMM keeps C in A's and B's type: no bf16 A/B with an f32 C (cuBLASLt's matmul
  // has that pair; ops/cuda/grouped_linear.cpp runs such dw_g per group through it).
  EXPECT_EQ(cublasGemmGroupedBatchedEx(h, &n_op, &n_op, &four, &four, &four, &one, a, CUDA_R_16BF,
                                       &four, b, CUDA_R_16BF, &four, &one, c, CUDA_R_32F, &four, 1,
                                       &one_group, CUBLAS_COMPUTE_32F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(&four, &four, CUDA_R_32F, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_SUCCESS);
  sync();
  EXPECT_EQ(cublasGemmGroupedBatchedEx(nullptr, &n_op, &n_op, &four, &four, &four, &one, a,
                                       CUDA_R_32F, &four, b, CUDA_R_32F, &four, &one, c, CUDA_R_32F,
                                       &four, 1, &one_group, CUBLAS_COMPUTE_32F),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
