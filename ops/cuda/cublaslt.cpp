// cuBLASLt GEMMs for the CUDA ops (see ops/cuda/cublaslt.h): the per-device handle, the
// per-stream workspaces, the plan cache, and the row-major to column-major translation.
//
// cuBLASLt is column-major. A row-major (r, c) matrix with leading dimension ld is, read
// column-major, its transpose (c, r) with the same ld. So the row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B, its "B" is our A, its (m, n, k) are
// our (cols, rows, inner), and each keeps its own transpose flag.
#include "ops/cuda/cublaslt.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/runtime/cuda_check.h"
#include "ops/op_common.h"

namespace moepeak::ops::cuda {
namespace {

// The cuBLASLt types of a storage dtype pair (see the header's table).
struct LtTypes {
  cudaDataType_t ab;            // A and B
  cudaDataType_t cd;            // C and D
  cublasComputeType_t compute;  // accumulation
  cudaDataType_t scale;         // alpha and beta
};

LtTypes lt_types(DType dtype, DType c_dtype) {
  if (c_dtype == dtype) {
    switch (dtype) {
      case DType::f32:
        return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
      case DType::bf16:
        return {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
      case DType::f64:
        return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
      default:
        break;
    }
    MOEPEAK_THROW("cuBLASLt GEMM supports f32, bf16 and f64 storage, got ", dtype_name(dtype));
  }
  // The fp32 main gradient: bf16 products accumulated into an f32 C.
  MOEPEAK_CHECK(dtype == DType::bf16 && c_dtype == DType::f32,
                "cuBLASLt GEMM takes C of A's and B's dtype, or f32 C for bf16 A and B; got ",
                dtype_name(dtype), " A/B with ", dtype_name(c_dtype), " C");
  return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 1;
  while (a < 256 && v % (2 * a) == 0) a *= 2;
  return a;
}

// Everything an algorithm choice depends on. Alignments are of our A, B and C pointers.
struct PlanKey {
  DType dtype;    // A and B
  DType c_dtype;  // C and D
  bool trans_a, trans_b;
  int64_t rows, cols, inner, lda, ldb, ldc;
  uint32_t align_a, align_b, align_c;
  int rank;  // which of the heuristic's algorithms (set_gemm_algorithm_rank)

  auto tie() const {
    return std::tie(dtype, c_dtype, trans_a, trans_b, rows, cols, inner, lda, ldb, ldc, align_a,
                    align_b, align_c, rank);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// Descriptors of one configuration and the algorithm the heuristic chose for it. Kept for the
// process (never destroyed), so a Plan* stays valid without the lock.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // cuBLASLt's A: our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // cuBLASLt's B: our A
  cublasLtMatrixLayout_t lt_c = nullptr;  // C and D: our C
  cublasLtMatmulAlgo_t algo{};

  void destroy() noexcept {
    if (lt_c != nullptr) cublasLtMatrixLayoutDestroy(lt_c);
    if (lt_b != nullptr) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a != nullptr) cublasLtMatrixLayoutDestroy(lt_a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    *this = Plan{};
  }
};

// One device's state. NOTES: never freed: the handle and workspaces live until the process ends
// (destroying them from a static destructor can run after the CUDA runtime has shut down).
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  std::map<PlanKey, Plan> plans;
};

std::mutex& state_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<int, DeviceState>& device_states() {
  static auto* s = new std::map<int, DeviceState>;
  return *s;
}

std::atomic<int>& algorithm_rank() {
  static std::atomic<int> rank{0};
  return rank;
}

std::string describe(const PlanKey& k) {
  const std::string ab(dtype_name(k.dtype)), cd(dtype_name(k.c_dtype));
  const std::string types = k.c_dtype == k.dtype ? ab : ab + " x " + ab + " -> " + cd;
  return types + " GEMM (" + std::to_string(k.rows) + ", " + std::to_string(k.inner) + ")" +
         (k.trans_a ? "^T" : "") + " x (" + std::to_string(k.inner) + ", " +
         std::to_string(k.cols) + ")" + (k.trans_b ? "^T" : "") + " with lda " +
         std::to_string(k.lda) + ", ldb " + std::to_string(k.ldb) + ", ldc " +
         std::to_string(k.ldc) + ", alignments " + std::to_string(k.align_a) + "/" +
         std::to_string(k.align_b) + "/" + std::to_string(k.align_c) + " bytes";
}

// Creates the descriptors of `key` and asks the heuristic for its algorithm. Caller holds the
// lock (the heuristic is host-only work, once per configuration).
Plan make_plan(cublasLtHandle_t handle, const PlanKey& key) {
  const LtTypes t = lt_types(key.dtype, key.c_dtype);
  const auto m = static_cast<uint64_t>(key.cols), n = static_cast<uint64_t>(key.rows),
             k = static_cast<uint64_t>(key.inner);
  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    MOEPEAK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, t.compute, t.scale));
    const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    MOEPEAK_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    MOEPEAK_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // Stored (column-major) shapes: cuBLASLt's A is (m, k) after op_a, so (k, m) when op_a
    // transposes; its B is (k, n) after op_b; C is (m, n).
    MOEPEAK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lt_a, t.ab, key.trans_b ? k : m,
                                                    key.trans_b ? m : k, key.ldb));
    MOEPEAK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lt_b, t.ab, key.trans_a ? n : k,
                                                    key.trans_a ? k : n, key.lda));
    MOEPEAK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lt_c, t.cd, m, n, key.ldc));

    MOEPEAK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t workspace = kWorkspaceBytes;
    MOEPEAK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    // The pointers' real alignments (cuBLASLt assumes 256 bytes unless told): a column block
    // w[:, k0:] may be aligned to its element size only.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c},
    };
    for (const auto& [attr, bytes] : alignments) {
      MOEPEAK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
    }

    // The heuristic's list up to the key's rank; a rank past its end takes the last one.
    cublasLtMatmulHeuristicResult_t results[kMaxAlgorithmRank + 1]{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, p.op, p.lt_a, p.lt_b, p.lt_c, p.lt_c, pref, key.rank + 1, results, &found);
    const int pick = found > key.rank ? key.rank : found > 0 ? found - 1 : 0;
    const cublasLtMatmulHeuristicResult_t& result = results[pick];
    if (status != CUBLAS_STATUS_SUCCESS || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      const cublasStatus_t why = status != CUBLAS_STATUS_SUCCESS ? status : result.state;
      MOEPEAK_THROW("cuBLASLt has no algorithm for a ", describe(key), ": ",
                    found < 1 && status == CUBLAS_STATUS_SUCCESS
                        ? std::string("the heuristic returned none")
                        : std::string(cublasLtGetStatusName(why)) + " (" +
                              cublasLtGetStatusString(why) + ")");
    }
    p.algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
  } catch (...) {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    p.destroy();
    throw;
  }
}

// What one call needs, looked up (or created) under the lock.
struct Launch {
  cublasLtHandle_t handle;
  const Plan* plan;
  void* workspace;
};

// The stream's workspace in `s`, allocated on first use. Caller holds the lock.
void* workspace_of(DeviceState& s, cudaStream_t stream) {
  auto ws = s.workspaces.find(stream);
  if (ws == s.workspaces.end()) {
    void* bytes = nullptr;
    MOEPEAK_CUDA_CHECK(cudaMalloc(&bytes, kWorkspaceBytes));
    ws = s.workspaces.emplace(stream, bytes).first;
  }
  return ws->second;
}

DeviceState& current_device_state() {
  int device = 0;
  MOEPEAK_CUDA_CHECK(cudaGetDevice(&device));
  return device_states()[device];
}

Launch prepare(const PlanKey& key, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& s = current_device_state();
  if (s.handle == nullptr) MOEPEAK_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  void* workspace = workspace_of(s, stream);
  auto plan = s.plans.find(key);
  if (plan == s.plans.end()) plan = s.plans.emplace(key, make_plan(s.handle, key)).first;
  return Launch{s.handle, &plan->second, workspace};
}

}  // namespace

void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t rows, int64_t cols,
          int64_t inner, double alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
          double beta, void* c, int64_t ldc, cudaStream_t stream) {
  const LtTypes t = lt_types(dtype, c_dtype);
  MOEPEAK_CHECK(rows >= 0 && cols >= 0 && inner >= 0, "cuda::gemm: sizes (rows ", rows, ", cols ",
                cols, ", inner ", inner, ") must not be negative");
  if (rows == 0 || cols == 0) return;
  const size_t es = dtype_size(c_dtype);  // C's elements (inner == 0 below)
  MOEPEAK_CHECK(c != nullptr && ldc >= cols, "cuda::gemm: C (", rows, ", ", cols,
                ") needs a pointer and ldc >= ", cols, ", got ldc ", ldc);
  if (inner == 0) {
    // No products: C = beta * C. cuBLASLt is not asked (k = 0 is not a GEMM it promises).
    if (beta == 0.0) {
      if (ldc == cols) {
        MOEPEAK_CUDA_CHECK(cudaMemsetAsync(
            c, 0, static_cast<size_t>(rows) * static_cast<size_t>(cols) * es, stream));
      } else {
        MOEPEAK_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * es, 0,
                                             static_cast<size_t>(cols) * es,
                                             static_cast<size_t>(rows), stream));
      }
      return;
    }
    MOEPEAK_CHECK(beta == 1.0, "cuda::gemm: inner == 0 supports beta 0 or 1, got ", beta);
    return;
  }
  MOEPEAK_CHECK(a != nullptr && lda >= (trans_a ? rows : inner),
                "cuda::gemm: A needs a pointer "
                "and lda >= ",
                trans_a ? rows : inner, ", got lda ", lda);
  MOEPEAK_CHECK(b != nullptr && ldb >= (trans_b ? inner : cols),
                "cuda::gemm: B needs a pointer "
                "and ldb >= ",
                trans_b ? inner : cols, ", got ldb ", ldb);

  const PlanKey key{dtype,
                    c_dtype,
                    trans_a,
                    trans_b,
                    rows,
                    cols,
                    inner,
                    lda,
                    ldb,
                    ldc,
                    alignment_of(a),
                    alignment_of(b),
                    alignment_of(c),
                    algorithm_rank().load()};
  const Launch l = prepare(key, stream);
  // Host pointer mode (the default): alpha and beta are read during the call.
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const bool f64 = t.scale == CUDA_R_64F;
  const void* alpha_p = f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = f64 ? static_cast<const void*>(&beta) : &beta_f;
  MOEPEAK_CUBLAS_CHECK(cublasLtMatmul(l.handle, l.plan->op, alpha_p, b, l.plan->lt_a, a,
                                      l.plan->lt_b, beta_p, c, l.plan->lt_c, c, l.plan->lt_c,
                                      &l.plan->algo, l.workspace, kWorkspaceBytes, stream));
}

int set_gemm_algorithm_rank(int rank) {
  MOEPEAK_CHECK(rank >= 0 && rank <= kMaxAlgorithmRank, "GEMM algorithm rank ", rank,
                " is outside [0, ", kMaxAlgorithmRank, "]");
  return algorithm_rank().exchange(rank);
}

void* stream_workspace(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  return workspace_of(current_device_state(), stream);
}

void expect_gemm_dtype(const char* op, DType dtype) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f64, "op ", op,
                " on CUDA supports f32, bf16 and f64, got ", dtype_name(dtype));
}

void expect_device_operand(const char* op, const Tensor& t, const char* name) {
  MOEPEAK_CHECK(t.numel() == 0 || runs_on_cuda(t), op, ": ", name,
                " must be device memory of a CUDA backend, got ", t.str());
}

}  // namespace moepeak::ops::cuda
