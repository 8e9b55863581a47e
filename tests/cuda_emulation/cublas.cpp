// The emulated cuBLAS and cuBLASLt (include/cublas_v2.h, include/cublasLt.h): reference
// implementations of exactly the calls moepeak makes (ops/cuda/cublaslt.cpp,
// ops/cuda/grouped_linear.cpp), on the host, in stream order (stream_order.h).
//
// Both APIs end in one column-major GEMM core, as cuBLAS defines it:
//   D (m, n) = alpha * op(A) (m, k) . op(B) (k, n) + beta * C (m, n)
// with op(X) = X (CUBLAS_OP_N) or X^T (CUBLAS_OP_T, and CUBLAS_OP_C on real data). Element (i, j)
// of a column-major matrix with leading dimension ld is at i + j * ld.
//
// Types (cuBLAS's tables, the part the emulation runs; anything else is NOT_SUPPORTED):
//   compute CUBLAS_COMPUTE_32F(_PEDANTIC), alpha/beta float:
//     A, B CUDA_R_16BF with C, D CUDA_R_16BF or CUDA_R_32F;  A, B, C, D CUDA_R_32F
//     (cublasGemmGroupedBatchedEx: C of A's and B's type only, so no CUDA_R_16BF A/B with a
//     CUDA_R_32F C there; cuBLASLt's matmul takes both, the f32 main gradient of ops/linear.h)
//   compute CUBLAS_COMPUTE_64F(_PEDANTIC), alpha/beta double: A, B, C, D CUDA_R_64F
// Math: each output is sum over p = 0, 1, ..., k-1 (in that order) of op(A)(i, p) * op(B)(p, j)
// in the compute type, starting from 0; then alpha * sum + beta * C(i, j) in the compute type,
// rounded once to D's type (bf16: round to nearest even). beta == 0 does not read C (it may hold
// NaN); k == 0 gives beta * C. Products and sums are the compiler's float/double operations (it
// may fuse them into FMAs where the target has them, as GPU kernels do).
//
// Not emulated: algorithm choice (the heuristic returns one algorithm, workspace 0, whatever the
// preference), TF32 and reduced-precision reductions (every math mode computes strict fp32),
// split-K and the real summation order of tensor-core kernels (so results match a GPU within
// rounding, not bit for bit), epilogues, batched layouts, device pointer mode, CUDA_R_16F.
// Workspaces are accepted and never touched.
//
// Statuses: a null handle is NOT_INITIALIZED (cuBLAS's status for it); a bad size, leading
// dimension, descriptor or attribute is INVALID_VALUE; a type combination outside the table is
// NOT_SUPPORTED. Stricter than cuBLAS: null data pointers are rejected (a GPU would fault later),
// a matmul whose pointers are less aligned than the preference promised to the heuristic returns
// NOT_SUPPORTED (real cuBLASLt fails only if the chosen kernel needed that alignment), and a null
// or misaligned entry of a grouped GEMM's pointer arrays (read when the work runs) throws in the
// work, which the runtime turns into the sticky cudaErrorLaunchFailure.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda_emulation/stream_order.h"

// ---- The opaque objects ------------------------------------------------------------------------

struct cublasContext {
  cudaStream_t stream = nullptr;  // cublasSetStream; the legacy default stream until then
  void* workspace = nullptr;      // cublasSetWorkspace (never used: the emulation needs none)
  size_t workspace_bytes = 0;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

struct cublasLtContext {
  int unused = 0;
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};

struct cublasLtMatrixLayoutOpaque_t {  // column-major (rows, cols), leading dimension ld
  cudaDataType_t type;
  int64_t rows, cols, ld;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D bytes (cuBLASLt's default)
};

namespace moepeak::cuda_emulation {
namespace {

// ---- bf16 bits (the top half of an IEEE float) -------------------------------------------------

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {  // round to nearest even; a NaN stays a (quiet) NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- Types -------------------------------------------------------------------------------------

enum class Math { f32, f64 };  // compute type and scale type together

// The math of a compute type; false for one the emulation does not run.
bool math_of(cublasComputeType_t compute, Math* math) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      *math = Math::f32;
      return true;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      *math = Math::f64;
      return true;
    default:
      return false;
  }
}

cudaDataType_t scale_type(Math math) { return math == Math::f32 ? CUDA_R_32F : CUDA_R_64F; }

size_t type_size(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : 0;
}

// Whether `math` runs A/B of type `ab` with C/D of type `cd` (the table in the file comment).
bool types_supported(Math math, cudaDataType_t ab, cudaDataType_t cd) {
  if (math == Math::f64) return ab == CUDA_R_64F && cd == CUDA_R_64F;
  return (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F)) ||
         (ab == CUDA_R_32F && cd == CUDA_R_32F);
}

// A transpose as N/T (false/true); false for a value that is none of cuBLAS's.
bool transpose_of(cublasOperation_t op, bool* t) {
  if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) return false;
  *t = op != CUBLAS_OP_N;
  return true;
}

bool aligned(const void* p, uint64_t bytes) {
  return bytes == 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- The GEMM core -----------------------------------------------------------------------------

// One column-major GEMM, its arguments already checked (see the file comment).
struct Gemm {
  Math math;
  bool trans_a, trans_b;
  int64_t m, n, k;
  cudaDataType_t ab_type, cd_type;
  double alpha, beta;  // the scale type's values (a float widened exactly)
  const void* a;       // A stored (m, k), or (k, m) with trans_a
  const void* b;       // B stored (k, n), or (n, k) with trans_b
  const void* c;       // C (m, n); not read when beta == 0
  void* d;             // D (m, n); may be C
  int64_t lda, ldb, ldc, ldd;
};

// Element i of a T array at p (device memory has no alignment promise beyond the element's, and
// memcpy states none).
template <typename T>
T read_as(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}
template <typename T>
void write_as(void* p, int64_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

// Element i of a `type` matrix in the compute type (exact: types_supported pairs f64 storage
// with f64 math only).
template <typename Acc>
Acc load(cudaDataType_t type, const void* p, int64_t i) {
  if (type == CUDA_R_16BF) return bf16_to_float(read_as<uint16_t>(p, i));
  if (type == CUDA_R_32F) return read_as<float>(p, i);
  return static_cast<Acc>(read_as<double>(p, i));
}

// The one rounding to D's type.
template <typename Acc>
void store(cudaDataType_t type, void* p, int64_t i, Acc v) {
  if (type == CUDA_R_16BF) {
    write_as(p, i, float_to_bf16(static_cast<float>(v)));
  } else if (type == CUDA_R_32F) {
    write_as(p, i, static_cast<float>(v));
  } else {
    write_as(p, i, static_cast<double>(v));
  }
}

template <typename Acc>
void run_gemm_in(const Gemm& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  // op(A) (m, k) and op(B) (k, n) in the compute type (exact: bf16 and f32 widen exactly),
  // column-major and packed: a[i + p * m], b[p + j * k].
  std::vector<Acc> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      a[p * m + i] = load<Acc>(g.ab_type, g.a, g.trans_a ? p + i * g.lda : i + p * g.lda);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      b[j * k + p] = load<Acc>(g.ab_type, g.b, g.trans_b ? j + p * g.ldb : p + j * g.ldb);
    }
  }
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
  std::vector<Acc> sum(static_cast<size_t>(m));
  for (int64_t j = 0; j < n; ++j) {
    // Column j of the products: sum[i] over p in increasing order, one accumulator per i.
    std::fill(sum.begin(), sum.end(), Acc(0));
    for (int64_t p = 0; p < k; ++p) {
      const Acc bpj = b[j * k + p];
      const Acc* col = &a[p * m];
      for (int64_t i = 0; i < m; ++i) sum[i] += col[i] * bpj;
    }
    for (int64_t i = 0; i < m; ++i) {
      Acc v = k == 0 ? Acc(0) : alpha * sum[i];
      if (beta != Acc(0)) v += beta * load<Acc>(g.cd_type, g.c, i + j * g.ldc);
      store<Acc>(g.cd_type, g.d, i + j * g.ldd, v);
    }
  }
}

void run_gemm(const Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.math == Math::f32) {
    run_gemm_in<float>(g);
  } else {
    run_gemm_in<double>(g);
  }
}

// Reads one alpha or beta (host pointer mode) in the scale type of `math`.
double scalar(Math math, const void* p, size_t index) {
  if (math == Math::f32) return static_cast<const float*>(p)[index];
  return static_cast<const double*>(p)[index];
}

// Puts `work` on `stream`; a stream the runtime rejects is an execution failure, as a kernel
// launch on it would be.
cublasStatus_t submit(cudaStream_t stream, const char* what, std::function<void()> work) {
  try {
    return enqueue(stream, what, std::move(work)) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                 : CUBLAS_STATUS_EXECUTION_FAILED;
  } catch (const std::bad_alloc&) {
    return CUBLAS_STATUS_ALLOC_FAILED;
  } catch (...) {
    return CUBLAS_STATUS_INTERNAL_ERROR;
  }
}

template <typename T>
cublasStatus_t create(T** out) {
  if (out == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *out = new (std::nothrow) T{};
  return *out == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

// Reads a `T` attribute value of exactly sizeof(T) bytes (cuBLASLt's rule for the size).
template <typename T>
bool read_attribute(const void* buf, size_t size, T* value) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(value, buf, sizeof(T));
  return true;
}

// ---- cuBLASLt: checking a matmul's descriptors -------------------------------------------------

// What cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul both check: a compute and scale type
// the emulation runs, A/B and C/D types it runs together, and shapes that agree:
// op(A) (m, k), op(B) (k, n), C and D (m, n). Fills in all but the pointers and scalars.
cublasStatus_t check_lt(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                        cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Gemm* out) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  Gemm p{};
  if (!math_of(desc->compute, &p.math) || desc->scale != scale_type(p.math)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (a->type != b->type || c->type != d->type || !types_supported(p.math, a->type, c->type)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  p.trans_a = desc->trans_a != CUBLAS_OP_N;
  p.trans_b = desc->trans_b != CUBLAS_OP_N;
  p.m = p.trans_a ? a->cols : a->rows;
  p.k = p.trans_a ? a->rows : a->cols;
  const int64_t kb = p.trans_b ? b->cols : b->rows;
  p.n = p.trans_b ? b->rows : b->cols;
  if (kb != p.k || c->rows != p.m || c->cols != p.n || d->rows != p.m || d->cols != p.n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  p.ab_type = a->type;
  p.cd_type = c->type;
  p.lda = a->ld;
  p.ldb = b->ld;
  p.ldc = c->ld;
  p.ldd = d->ld;
  *out = p;
  return CUBLAS_STATUS_SUCCESS;
}

// The heuristic's one algorithm: a mark, the configuration's types, and the alignments the
// preference promised (checked against the pointers by cublasLtMatmul).
constexpr uint64_t kAlgoMark = 0x6d6f6570656d756cull;  // "moepemul"

uint64_t types_word(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t c) {
  return static_cast<uint64_t>(desc->compute) << 32 | static_cast<uint64_t>(a->type) << 16 |
         static_cast<uint64_t>(c->type);
}

// cuBLAS's names of its statuses, and its descriptions of them.
struct StatusText {
  cublasStatus_t status;
  const char* name;
  const char* text;
};
constexpr StatusText kStatusTexts[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "an error was detected when checking the current licensing"},
};

}  // namespace
}  // namespace moepeak::cuda_emulation

// The C API below, at global scope, in terms of the helpers above.
using namespace moepeak::cuda_emulation;

// ---- cuBLASLt ----------------------------------------------------------------------------------

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { return create(handle); }

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  const cublasStatus_t s = create(desc);
  if (s == CUBLAS_STATUS_SUCCESS) {
    (*desc)->compute = compute;  // checked when used (the heuristic, the matmul)
    (*desc)->scale = scale;
  }
  return s;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t v = 0;
  uint32_t epilogue = 0;
  bool t = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (!read_attribute(buf, size, &v) || !transpose_of(static_cast<cublasOperation_t>(v), &t)) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) =
          t ? CUBLAS_OP_T : CUBLAS_OP_N;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      if (!read_attribute(buf, size, &v)) return CUBLAS_STATUS_INVALID_VALUE;
      desc->scale = static_cast<cudaDataType_t>(v);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:  // host pointer mode only
    case CUBLASLT_MATMUL_DESC_TRANSC:        // C untransposed only
      if (!read_attribute(buf, size, &v)) return CUBLAS_STATUS_INVALID_VALUE;
      return v == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:  // no epilogue only
      if (!read_attribute(buf, size, &epilogue)) return CUBLAS_STATUS_INVALID_VALUE;
      return epilogue == CUBLASLT_EPILOGUE_DEFAULT ? CUBLAS_STATUS_SUCCESS
                                                   : CUBLAS_STATUS_NOT_SUPPORTED;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (layout == nullptr || rows > kMax || cols > kMax ||
      ld < std::max<int64_t>(1, static_cast<int64_t>(rows))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cublasStatus_t s = create(layout);
  if (s == CUBLAS_STATUS_SUCCESS) {
    **layout = {type, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld};
  }
  return s;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create(pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  float f = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (!read_attribute(buf, size, &u32)) return CUBLAS_STATUS_INVALID_VALUE;
      pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = u32;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:  // accepted, no effect (one algorithm)
      return read_attribute(buf, size, &u32) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:  // any: the algorithm needs none
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return read_attribute(buf, size, &u64) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return read_attribute(buf, size, &f) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (returned == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || requested < 1 || results == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm p;
  const cublasStatus_t s = check_lt(handle, desc, a, b, c, d, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMark;
  r.algo.data[1] = types_word(desc, a, c);
  for (int i = 0; i < 4; ++i) r.algo.data[2 + i] = pref->min_alignment[i];
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_desc, const void* B,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_desc, void* D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* /*workspace: none needed*/,
                              size_t /*workspace bytes*/, cudaStream_t stream) {
  Gemm g;
  const cublasStatus_t s = check_lt(handle, desc, a_desc, b_desc, c_desc, d_desc, &g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // In place (C == D) needs one layout for both (cuBLASLt's rule: ldc == ldd).
  if (C == D && g.ldc != g.ldd) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr &&
      (algo->data[0] != kAlgoMark || algo->data[1] != types_word(desc, a_desc, c_desc))) {
    return CUBLAS_STATUS_INVALID_VALUE;  // not a result of the heuristic for these types
  }
  g.alpha = scalar(g.math, alpha, 0);  // host pointer mode: read now
  g.beta = scalar(g.math, beta, 0);
  g.a = A;
  g.b = B;
  g.c = C;
  g.d = D;
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  if ((g.k > 0 && (A == nullptr || B == nullptr)) || D == nullptr ||
      (g.beta != 0 && C == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const void* pointers[4] = {A, B, C, D};
  const size_t elem[4] = {type_size(a_desc->type), type_size(b_desc->type), type_size(c_desc->type),
                          type_size(d_desc->type)};
  for (int i = 0; i < 4; ++i) {
    // Each pointer aligned to its element, and to what the heuristic was promised.
    const uint64_t promised = algo != nullptr ? algo->data[2 + i] : 0;
    if (!aligned(pointers[i], elem[i]) || !aligned(pointers[i], promised)) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  return submit(stream, "cublasLtMatmul", [g] { run_gemm(g); });
}

// ---- cuBLAS ------------------------------------------------------------------------------------

cublasStatus_t cublasCreate(cublasHandle_t* handle) { return create(handle); }

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  handle->workspace = nullptr;  // cuBLAS: a new stream goes back to the default workspace
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if ((workspace == nullptr && bytes > 0) || !aligned(workspace, 256)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->math = mode;  // remembered; the math is strict fp32 in every mode
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Math math;
  if (!math_of(computeType, &math) || Atype != Btype || !types_supported(math, Atype, Ctype) ||
      (math == Math::f32 && Ctype != Atype)) {  // the grouped GEMM keeps one storage type
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (group_count == 0) return CUBLAS_STATUS_SUCCESS;
  if (transa_array == nullptr || transb_array == nullptr || m_array == nullptr ||
      n_array == nullptr || k_array == nullptr || alpha_array == nullptr || beta_array == nullptr ||
      lda_array == nullptr || ldb_array == nullptr || ldc_array == nullptr ||
      group_size == nullptr || Aarray == nullptr || Barray == nullptr || Carray == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // The host arrays, read now (host pointer mode): one Gemm per group, pointers filled in later.
  struct Group {
    Gemm gemm;
    int count;
  };
  std::vector<Group> groups;
  try {
    groups.reserve(static_cast<size_t>(group_count));
  } catch (const std::bad_alloc&) {
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  for (int g = 0; g < group_count; ++g) {
    bool ta = false, tb = false;
    const int m = m_array[g], n = n_array[g], k = k_array[g];
    if (!transpose_of(transa_array[g], &ta) || !transpose_of(transb_array[g], &tb) || m < 0 ||
        n < 0 || k < 0 || group_size[g] < 0 || lda_array[g] < std::max(1, ta ? k : m) ||
        ldb_array[g] < std::max(1, tb ? n : k) || ldc_array[g] < std::max(1, m)) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    Gemm gemm{};  // a, b, c and d: from the pointer arrays, when it runs
    gemm.math = math;
    gemm.trans_a = ta;
    gemm.trans_b = tb;
    gemm.m = m;
    gemm.n = n;
    gemm.k = k;
    gemm.ab_type = Atype;
    gemm.cd_type = Ctype;
    gemm.alpha = scalar(math, alpha_array, static_cast<size_t>(g));
    gemm.beta = scalar(math, beta_array, static_cast<size_t>(g));
    gemm.lda = lda_array[g];
    gemm.ldb = ldb_array[g];
    gemm.ldc = gemm.ldd = ldc_array[g];
    groups.push_back({gemm, group_size[g]});
  }
  // The pointer arrays are device memory, written by work queued before this (a copy): read
  // them when the GEMMs run, GEMM by GEMM in group order.
  const size_t elem = type_size(Atype);
  auto work = [groups = std::move(groups), Aarray, Barray, Carray, elem] {
    size_t at = 0;
    for (const Group& group : groups) {
      for (int i = 0; i < group.count; ++i, ++at) {
        Gemm g = group.gemm;
        g.a = Aarray[at];
        g.b = Barray[at];
        g.c = g.d = Carray[at];
        if (g.m == 0 || g.n == 0) continue;
        const bool need_ab = g.k > 0;
        if ((need_ab && (g.a == nullptr || g.b == nullptr)) || g.d == nullptr ||
            !aligned(g.a, elem) || !aligned(g.b, elem) || !aligned(g.d, elem)) {
          throw std::runtime_error("GEMM " + std::to_string(at) +
                                   " has a null or misaligned A, B or C pointer");
        }
        run_gemm(g);
      }
    }
  };
  return submit(handle->stream, "cublasGemmGroupedBatchedEx", std::move(work));
}

// ---- Status names ------------------------------------------------------------------------------

const char* cublasGetStatusName(cublasStatus_t status) {
  for (const StatusText& t : kStatusTexts) {
    if (t.status == status) return t.name;
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  for (const StatusText& t : kStatusTexts) {
    if (t.status == status) return t.text;
  }
  return "unknown error";
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }

const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

}  // extern "C"
