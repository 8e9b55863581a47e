// CUDA grouped linear (see ops/grouped_linear.h): the experts' GEMMs of one call in one
// cublasGemmGroupedBatchedEx, on f32 or bf16 storage. For each non-empty group g (rows
// [lo, hi) = [offsets[g], offsets[g + 1]), M_g = hi - lo), the row-major GEMMs of
// ops/cuda/linear.cpp:
//   forward   y[lo:hi] (M_g, N)  (+)= x[lo:hi] (M_g, K) . w_g^T         one grouped call
//   backward  dx[lo:hi] (M_g, K) (+)= dy[lo:hi] (M_g, N) . w_g (N, K)   one grouped call
//             dw_g (N, K)         += dy[lo:hi]^T . x[lo:hi]            one grouped call
// Each GEMM is its own cuBLAS group (group_size 1: the groups differ in M_g), translated to
// cuBLAS's column-major terms as ops/cuda/cublaslt.cpp does: the row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so cuBLAS's A is our B, its B our A, and its (m, n, k) our
// (cols, rows, inner). Math: CUBLAS_COMPUTE_32F with fp32 alpha/beta for both storages: f32 is
// strict fp32 (the handle's math mode is CUBLAS_DEFAULT_MATH, so no TF32), bf16 multiplies in
// fp32 and rounds each output to bf16 once; reductions stay in fp32
// (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION). f64, K == 0, N == 0, sizes past int32 and
// groups of more than kGroupedCallMaxMeanRows rows on average run the per-group loop of
// ops/cuda/linear.cpp instead, as do weight gradients whose dw_g overlap one another (one grouped
// call would add into the same memory concurrently), and every call while
// set_grouped_gemm_per_group(true) is in force (benches); a call with a pointer or a leading
// dimension off 16 bytes runs its GEMMs one cuda::gemm each (GroupedGemm::run). An f32 dw_g of a
// bf16 x (the fp32 main gradient, ops/grouped_linear.h) is one cuBLASLt GEMM per group, bf16 A/B
// with f32 C/D and CUBLAS_COMPUTE_32F, beta = 1 (ops/cuda/linear.cpp): the type table of
// cublasGemmGroupedBatchedEx pairs each A/B type with a C of the same type only
// (CUBLAS_COMPUTE_32F: 16F/16F, 16BF/16BF, 32F/32F), so the grouped call cannot write an f32 C
// from bf16 inputs. dx and the bf16 dw_g of the same call stay grouped.
//
// What the module keeps, per (device, stream) that runs a grouped GEMM (created on first use,
// never freed, as ops/cuda/cublaslt.cpp keeps its state):
// - one cublasHandle_t, bound to the stream (cublasSetStream) and then to the stream's cuBLASLt
//   workspace (cublasSetWorkspace; cublasSetStream resets the workspace, so it comes second);
// - kStagingSlots staging slots for the pointer arrays cuBLAS reads on the device (A, B and C,
//   3 pointers per GEMM): each a pinned host array and a device array of the same capacity, and
//   an event recorded after the grouped GEMM that last read the slot.
// NOTES: which guarantees the pointer staging relies on. A call writes its pointers into the
// pinned half of a slot, copies them with cudaMemcpyAsync (host to device) on the caller's stream,
// runs the GEMM on the same stream, and records the slot's event after it. A slot is written
// again only after cudaEventSynchronize on that event, i.e. after the copy and the GEMM that read
// it have run: correctness rests on stream order and event completion only, not on the driver
// staging a pageable source before cudaMemcpyAsync returns (a pinned source is read when the copy
// runs, and the device half is read by the GEMM). The wait is a no-op unless the host has run
// kStagingSlots grouped calls ahead of the GPU on that stream. The host arrays of sizes, leading
// dimensions and alpha/beta are cuBLAS host inputs (host pointer mode), read during the call.
// The slots (at least kMinStagingPointers pointers each, pinned and device) and the handle live
// outside the arena, in the plan's `cublas` term (core/runtime/outside_arena.h); a slot grows
// (cudaFree, which synchronises) only for a call with more GEMMs than it holds. Test: ctest -L cuda
// -R test_backend_ops (cases in tests/ops/backend_ops/cases_grouped_linear.cpp).
#include "ops/grouped_linear.h"

#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime/cuda_check.h"
#include "ops/cuda/cublaslt.h"
#include "ops/linear.h"

namespace moepeak::ops {
namespace {

constexpr size_t kStagingSlots = 8;

std::atomic<bool> g_per_group{false};            // set_grouped_gemm_per_group
constexpr size_t kMinStagingPointers = 3 * 256;  // 256 GEMMs (experts) per call before growing

cudaStream_t native(Stream& stream) { return static_cast<cudaStream_t>(stream.native_handle()); }

// Row `row` of a 2-D row-major tensor.
void* row_pointer(const Tensor& t, int64_t row) {
  return static_cast<char*>(t.data()) +
         row * t.size(1) * static_cast<int64_t>(dtype_size(t.dtype()));
}

// ---- Per-stream cuBLAS state -----------------------------------------------------------------

struct StagingSlot {
  void** host = nullptr;    // pinned, `capacity` pointers
  void** device = nullptr;  // `capacity` pointers
  size_t capacity = 0;
  cudaEvent_t read = nullptr;  // recorded after the last GEMM that read this slot
  bool pending = false;        // `read` was recorded and not yet waited for
};

struct StreamState {
  std::mutex mutex;  // one grouped call at a time on this stream's handle and slots
  cublasHandle_t handle = nullptr;
  std::array<StagingSlot, kStagingSlots> slots;
  size_t next_slot = 0;
};

std::mutex& states_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
// NOTES: never freed (see the file comment); map nodes do not move, so a StreamState& stays valid.
std::map<std::pair<int, cudaStream_t>, StreamState>& stream_states() {
  static auto* s = new std::map<std::pair<int, cudaStream_t>, StreamState>;
  return *s;
}

// This stream's state on the current device, its handle created and bound on first use.
StreamState& state_for(cudaStream_t stream) {
  int device = 0;
  MOEPEAK_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(states_mutex());
  StreamState& s = stream_states()[{device, stream}];
  if (s.handle != nullptr) return s;
  cublasHandle_t handle = nullptr;
  MOEPEAK_CUBLAS_CHECK(cublasCreate(&handle));
  try {
    MOEPEAK_CUBLAS_CHECK(cublasSetStream(handle, stream));
    MOEPEAK_CUBLAS_CHECK(
        cublasSetWorkspace(handle, cuda::stream_workspace(stream), cuda::kWorkspaceBytes));
    MOEPEAK_CUBLAS_CHECK(cublasSetMathMode(
        handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  s.handle = handle;
  return s;
}

// The next slot, with room for `count` pointers and free to write: waits for the GEMM that last
// read it (a no-op unless the host is kStagingSlots calls ahead). Caller holds s.mutex.
StagingSlot& take_slot(StreamState& s, size_t count) {
  StagingSlot& slot = s.slots[s.next_slot];
  s.next_slot = (s.next_slot + 1) % kStagingSlots;
  if (slot.read == nullptr) {
    MOEPEAK_CUDA_CHECK(cudaEventCreateWithFlags(&slot.read, cudaEventDisableTiming));
  }
  if (slot.pending) {
    MOEPEAK_CUDA_CHECK(cudaEventSynchronize(slot.read));
    slot.pending = false;
  }
  if (slot.capacity < count) {
    slot.capacity = 0;
    if (slot.host != nullptr) MOEPEAK_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    if (slot.device != nullptr) MOEPEAK_CUDA_CHECK(cudaFree(slot.device));
    slot.device = nullptr;
    const size_t capacity = std::max(count, kMinStagingPointers);
    void* host = nullptr;
    void* device = nullptr;
    MOEPEAK_CUDA_CHECK(cudaMallocHost(&host, capacity * sizeof(void*)));
    slot.host = static_cast<void**>(host);
    MOEPEAK_CUDA_CHECK(cudaMalloc(&device, capacity * sizeof(void*)));
    slot.device = static_cast<void**>(device);
    slot.capacity = capacity;
  }
  return slot;
}

// ---- One grouped call --------------------------------------------------------------------------

// The GEMMs of one cublasGemmGroupedBatchedEx, each added in the row-major terms of cuda::gemm
// (ops/cuda/cublaslt.h) and turned into cuBLAS's column-major ones by run(), one cuBLAS group per
// GEMM.
class GroupedGemm {
 public:
  // C (rows, cols) = op(A) (rows, inner) . op(B) (inner, cols) + beta * C, row-major with leading
  // dimensions lda, ldb, ldc; every size positive and within int32 (the caller checked).
  void add(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const void* a,
           int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
    gemms_.push_back({trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, beta, c, ldc});
  }

  size_t size() const { return gemms_.size(); }

  // Enqueues the call on `stream` (nothing when no GEMM was added). `op` names the caller in
  // errors.
  void run(const char* op, DType dtype, Stream& stream) const {
    const size_t G = size();
    if (G == 0) return;
    const cudaStream_t st = native(stream);
    if (!vector_aligned(dtype)) {
      // NOTES: the grouped call reads its pointers on the device, so cuBLAS cannot pick a kernel
      // for a pointer or leading dimension off 16 bytes (a row offset of a bf16 matrix whose
      // width is not a multiple of 8) the way cuBLASLt's heuristic does when told each
      // alignment. Such calls run as cuda::gemm per GEMM, the same math.
      for (const RowMajorGemm& g : gemms_) {
        cuda::gemm(dtype, g.trans_a, g.trans_b, g.rows, g.cols, g.inner, 1.0, g.a, g.lda, g.b,
                   g.ldb, g.beta, g.c, g.ldc, st);
      }
      return;
    }
    // cuBLAS's column-major terms: the row-major C = op(A) op(B) is C^T = op(B)^T op(A)^T, so
    // cuBLAS's A is our B (with our trans_b), its B our A, and its (m, n, k) our (cols, rows,
    // inner). The host arrays are read during the call only.
    std::vector<cublasOperation_t> trans_a(G), trans_b(G);
    std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), group_size(G, 1);
    std::vector<float> alpha(G, 1.0f), beta(G);
    for (size_t i = 0; i < G; ++i) {
      const RowMajorGemm& g = gemms_[i];
      trans_a[i] = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      trans_b[i] = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      m[i] = static_cast<int>(g.cols);
      n[i] = static_cast<int>(g.rows);
      k[i] = static_cast<int>(g.inner);
      lda[i] = static_cast<int>(g.ldb);
      ldb[i] = static_cast<int>(g.lda);
      ldc[i] = static_cast<int>(g.ldc);
      beta[i] = g.beta;
    }
    StreamState& s = state_for(st);
    std::lock_guard<std::mutex> lock(s.mutex);
    StagingSlot& slot = take_slot(s, 3 * G);
    void** host = slot.host;
    for (size_t i = 0; i < G; ++i) {
      host[i] = const_cast<void*>(gemms_[i].b);      // cuBLAS's A
      host[G + i] = const_cast<void*>(gemms_[i].a);  // cuBLAS's B
      host[2 * G + i] = gemms_[i].c;
    }
    MOEPEAK_CUDA_CHECK(
        cudaMemcpyAsync(slot.device, host, 3 * G * sizeof(void*), cudaMemcpyHostToDevice, st));
    const cudaDataType_t type = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    // The device arrays: A pointers, then B's, then C's.
    const void* const* a_array = slot.device;
    const void* const* b_array = slot.device + G;
    void* const* c_array = slot.device + 2 * G;
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        s.handle, trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(), alpha.data(),
        a_array, type, lda.data(), b_array, type, ldb.data(), beta.data(), c_array, type,
        ldc.data(), static_cast<int>(G), group_size.data(), CUBLAS_COMPUTE_32F);
    // Recorded whatever the status: the copy above is queued and reads the slot.
    const cudaError_t recorded = cudaEventRecord(slot.read, st);
    slot.pending = recorded == cudaSuccess;
    if (status != CUBLAS_STATUS_SUCCESS) {
      MOEPEAK_THROW(op, ": cublasGemmGroupedBatchedEx of ", G, " ", dtype_name(dtype),
                    " GEMMs failed: ", cublasGetStatusName(status), " (",
                    cublasGetStatusString(status), ")");
    }
    MOEPEAK_CUDA_CHECK(recorded);
  }

 private:
  struct RowMajorGemm {  // add()'s arguments
    bool trans_a, trans_b;
    int64_t rows, cols, inner;
    const void* a;
    int64_t lda;
    const void* b;
    int64_t ldb;
    float beta;
    void* c;
    int64_t ldc;
  };
  // True when every pointer and every leading dimension (in bytes) is a multiple of 16.
  bool vector_aligned(DType dtype) const {
    const auto elem = static_cast<int64_t>(dtype_size(dtype));
    auto ok = [&](const void* p, int64_t ld) {
      return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * elem) % 16 == 0;
    };
    for (const RowMajorGemm& g : gemms_) {
      if (!ok(g.a, g.lda) || !ok(g.b, g.ldb) || !ok(g.c, g.ldc)) return false;
    }
    return true;
  }

  std::vector<RowMajorGemm> gemms_;
};

// True when one grouped call takes the problem: f32 or bf16 storage (cuBLAS's grouped GEMM has
// no f64 with COMPUTE_32F), no empty inner or output dimension (cuda::gemm's zero-fill handles
// those), every size and leading dimension within int32, and groups of at most
// kGroupedCallMaxMeanRows rows on average — unless a bench asked for the per-group loop.
// NOTES: and only when the groups are small. On an H200 (docs/perf.md, bench gemm) a grouped
// call over 32 groups of 1024 rows (H = F = 2880, bf16) took 1.62 ms where one cuBLASLt GEMM per
// group took 0.79 ms: the grouped kernel's tiles are chosen for the call as a whole, not per
// group. The grouped call pays off when launches dominate: groups of a few hundred rows or fewer.
constexpr int64_t kGroupedCallMaxMeanRows = 256;

bool grouped_call_takes(DType dtype, int64_t M, int64_t N, int64_t K,
                        std::span<const int64_t> offsets) {
  int64_t groups = 0;  // the non-empty ones
  for (size_t g = 0; g + 1 < offsets.size(); ++g) groups += offsets[g + 1] > offsets[g];
  return (dtype == DType::f32 || dtype == DType::bf16) && N > 0 && K > 0 && M <= INT_MAX &&
         N <= INT_MAX && K <= INT_MAX && M <= groups * kGroupedCallMaxMeanRows &&
         !g_per_group.load(std::memory_order_relaxed);
}

// True when two of the given dw_g share memory.
bool weight_grads_overlap(std::span<const Tensor> dw, const std::vector<bool>& given) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end) bytes
  for (size_t g = 0; g < dw.size(); ++g) {
    if (!given[g] || dw[g].nbytes() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(dw[g].data());
    ranges.emplace_back(begin, begin + dw[g].nbytes());
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return true;
  }
  return false;
}

void expect_weights_on_device(const char* op, std::span<const Tensor> w, const char* name) {
  for (size_t g = 0; g < w.size(); ++g) {
    const std::string label = std::string(name) + "[" + std::to_string(g) + "]";
    cuda::expect_device_operand(op, w[g], label.c_str());
  }
}

}  // namespace

void grouped_linear_forward_cuda(const Tensor& x, std::span<const Tensor> w,
                                 std::span<const int64_t> offsets, const Tensor& y, bool accumulate,
                                 Stream& stream) {
  const char* op = "grouped_linear_forward_cuda";
  check_grouped_linear_forward_args(op, x, w, offsets, y);
  cuda::expect_gemm_dtype(op, x.dtype());
  cuda::expect_device_operand(op, x, "x");
  cuda::expect_device_operand(op, y, "y");
  expect_weights_on_device(op, w, "w");
  const int64_t M = x.size(0), K = x.size(1), N = w[0].size(0);
  const size_t G = w.size();
  if (!grouped_call_takes(x.dtype(), M, N, K, offsets)) {
    for (size_t g = 0; g < G; ++g) {
      const int64_t lo = offsets[g], hi = offsets[g + 1];
      if (lo < hi) linear_forward_cuda(x.rows(lo, hi), w[g], y.rows(lo, hi), accumulate, stream);
    }
    return;
  }
  GroupedGemm gemm;
  for (size_t g = 0; g < G; ++g) {
    const int64_t lo = offsets[g], hi = offsets[g + 1];
    if (lo == hi) continue;
    // y[lo:hi] (M_g, N) = x[lo:hi] (M_g, K) . w_g^T, w_g stored (N, K).
    gemm.add(false, true, hi - lo, N, K, row_pointer(x, lo), K, w[g].data(), K,
             accumulate ? 1.0f : 0.0f, row_pointer(y, lo), N);
  }
  gemm.run(op, x.dtype(), stream);
}

void grouped_linear_backward_cuda(const Tensor& x, std::span<const Tensor> w,
                                  std::span<const int64_t> offsets, const Tensor& dy,
                                  const Tensor& dx, bool accumulate_dx, std::span<const Tensor> dw,
                                  Stream& stream) {
  const char* op = "grouped_linear_backward_cuda";
  const GroupedLinearGrads want = check_grouped_linear_backward_args(op, x, w, offsets, dy, dx, dw);
  cuda::expect_gemm_dtype(op, x.dtype());
  cuda::expect_device_operand(op, x, "x");
  cuda::expect_device_operand(op, dy, "dy");
  expect_weights_on_device(op, w, "w");
  if (want.dx) cuda::expect_device_operand(op, dx, "dx");
  for (size_t g = 0; g < dw.size(); ++g) {
    if (!want.dw[g]) continue;
    const std::string label = "dw[" + std::to_string(g) + "]";
    cuda::expect_device_operand(op, dw[g], label.c_str());
  }
  const int64_t M = x.size(0), K = x.size(1), N = w[0].size(0);
  const size_t G = w.size();
  const bool grouped = grouped_call_takes(x.dtype(), M, N, K, offsets);
  const bool grouped_dw = grouped && !weight_grads_overlap(dw, want.dw);
  // The dw_g the grouped dw call takes: those of x's dtype. An f32 dw_g of a bf16 x runs as its
  // own GEMM below (the file comment: the grouped call keeps C in A's type).
  auto in_grouped_dw = [&](size_t g) { return grouped_dw && dw[g].dtype() == x.dtype(); };
  GroupedGemm dx_gemm, dw_gemm;
  for (size_t g = 0; g < G; ++g) {
    const int64_t lo = offsets[g], hi = offsets[g + 1];
    if (lo == hi) continue;  // no rows: dx has none, dw_g += 0
    const Tensor no_grad;
    if (!grouped) {
      linear_backward_cuda(x.rows(lo, hi), w[g], dy.rows(lo, hi),
                           want.dx ? dx.rows(lo, hi) : no_grad, accumulate_dx,
                           want.dw[g] ? dw[g] : no_grad, stream);
      continue;
    }
    if (want.dx) {
      // dx[lo:hi] (M_g, K) = dy[lo:hi] (M_g, N) . w_g (N, K).
      dx_gemm.add(false, false, hi - lo, K, N, row_pointer(dy, lo), N, w[g].data(), K,
                  accumulate_dx ? 1.0f : 0.0f, row_pointer(dx, lo), K);
    }
    if (want.dw[g] && in_grouped_dw(g)) {
      // dw_g (N, K) += dy[lo:hi]^T (N, M_g) . x[lo:hi] (M_g, K), dy stored (M_g, N).
      dw_gemm.add(true, false, N, K, hi - lo, row_pointer(dy, lo), N, row_pointer(x, lo), K, 1.0f,
                  dw[g].data(), K);
    }
  }
  dx_gemm.run(op, x.dtype(), stream);
  if (grouped) {
    // Overlapping dw_g, and f32 dw_g of a bf16 x: one GEMM at a time (cuBLASLt, bf16 x bf16 ->
    // f32 for the latter), in group order (stream order keeps overlapping ones apart).
    for (size_t g = 0; g < G; ++g) {
      const int64_t lo = offsets[g], hi = offsets[g + 1];
      if (lo < hi && want.dw[g] && !in_grouped_dw(g)) {
        linear_backward_cuda(x.rows(lo, hi), w[g], dy.rows(lo, hi), Tensor(), false, dw[g], stream);
      }
    }
  }
  dw_gemm.run(op, x.dtype(), stream);
}

bool set_grouped_gemm_per_group_cuda(bool per_group) { return g_per_group.exchange(per_group); }

}  // namespace moepeak::ops
