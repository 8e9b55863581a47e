// grouped_linear: the experts' linear layers of one MoE layer in one call. The rows of x are
// grouped by expert (contiguous blocks, as the dispatch schedules lay them out), and group g
// multiplies its rows by its own weight w_g:
//
//   x:       (M, K) f32 | bf16 | f64 (on both backends)
//   w:       G tensors (N, K), x's dtype (nn.Linear layout), G >= 1, one N for all
//   offsets: G + 1 host row offsets, offsets[0] = 0 <= offsets[1] <= ... <= offsets[G] = M;
//            group g owns rows [offsets[g], offsets[g + 1]) (an empty group owns none)
//   y:       (M, N)   y[g rows] = x[g rows] w_g^T, written (=) or, with accumulate, added (+=)
//   dy:      (M, N)
//   dx:      (M, K)   dx[g rows] = dy[g rows] w_g, written (=) or, with accumulate_dx, added (+=);
//                     pass an undefined Tensor() to skip it
//   dw:      empty (no weight gradients) or G tensors (N, K): dw_g += dy[g rows]^T x[g rows],
//            always accumulated; an undefined dw_g skips that group's gradient. x's dtype, or
//            f32 when x is bf16 (the fp32 main gradient, as in ops/linear.h), on both backends
//
// It computes exactly what the loop over groups of ops/linear.h computes,
//   for g: linear_forward(x.rows(o[g], o[g+1]), w[g], y.rows(o[g], o[g+1]), accumulate)
//   for g: linear_backward(x.rows(..), w[g], dy.rows(..), dx.rows(..) or Tensor(),
//                          accumulate_dx, dw.empty() ? Tensor() : dw[g])
// and the checks (check_grouped_linear_*_args below) name the op, the group and the mismatch.
// K == 0 or N == 0 behave as in ops/linear.h (y = 0 without accumulate; dx = 0 without
// accumulate_dx).
// CPU (ops/cpu/grouped_linear.cpp): that loop over the non-empty groups, through the CPU linear
// entry points, so results are bitwise those of the per-expert loop (bf16 storage: fp32
// arithmetic and one rounding per bf16 output per group, ops/cpu/gemm_tiles.h).
// CUDA (ops/cuda/grouped_linear.cpp): f32 and bf16 through cublasGemmGroupedBatchedEx, one
// cuBLAS call for the forward, and in backward one for dx and one for dw, over the non-empty
// groups; f32 in strict fp32 (no TF32), bf16 storage with fp32 accumulation and one rounding to
// bf16 per output (as ops/linear.h on CUDA). f64 (test references), K == 0, N == 0 and sizes past
// int32 run the per-group loop of CUDA linear calls instead, and so does each f32 dw_g of a bf16
// x: one cuBLASLt GEMM with bf16 A/B and f32 C/D, fp32 accumulation, beta = 1 (the grouped cuBLAS
// call keeps C in A's type; dx and any bf16 dw_g stay grouped). Each call copies its pointer arrays
// (3 per GEMM) to a small per-stream device buffer through pinned staging on the stream; nothing
// grows with the tokens, and a call waits for the GPU only when the host is 8 grouped calls
// ahead on that stream, or allocates when one needs room for more than 256 GEMMs for the first
// time (see the file's NOTES).
//
// Test: ctest -R test_grouped_linear (CPU, against the per-group loop bitwise and a float64
// reference, f32, f64 and bf16); ctest -R test_backend_ops (both backends, f32 dw_g included,
// cases in tests/ops/backend_ops/cases_grouped_linear.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void grouped_linear_forward_cpu(const Tensor& x, std::span<const Tensor> w,
                                std::span<const int64_t> offsets, const Tensor& y, bool accumulate,
                                Stream& stream);
void grouped_linear_backward_cpu(const Tensor& x, std::span<const Tensor> w,
                                 std::span<const int64_t> offsets, const Tensor& dy,
                                 const Tensor& dx, bool accumulate_dx, std::span<const Tensor> dw,
                                 Stream& stream);

// The checks both backends run at the call (defined in ops/cpu/grouped_linear.cpp; each throws
// moepeak::Error naming `op`, the group and the mismatch).
// x (M, K) with G = w.size() >= 1 weights (N, K) of x's dtype and G + 1 offsets as above.
// Returns N.
int64_t check_grouped_linear_args(const char* op, const Tensor& x, std::span<const Tensor> w,
                                  std::span<const int64_t> offsets);
// The above and y (M, N).
void check_grouped_linear_forward_args(const char* op, const Tensor& x, std::span<const Tensor> w,
                                       std::span<const int64_t> offsets, const Tensor& y);
// Which gradients a grouped backward forms: dx when it is given (defined, or shaped like a
// (0, K) dx with no bytes); dw[g] when dw is not empty and dw[g] is given.
struct GroupedLinearGrads {
  bool dx = false;
  std::vector<bool> dw;  // G entries, all false when dw is empty
};
// The above, dy (M, N), a given dx (M, K), and dw empty or G entries, each given one (N, K), all
// of x's dtype, except that a bf16 x may have f32 dw_g (the fp32 main gradient).
GroupedLinearGrads check_grouped_linear_backward_args(const char* op, const Tensor& x,
                                                      std::span<const Tensor> w,
                                                      std::span<const int64_t> offsets,
                                                      const Tensor& dy, const Tensor& dx,
                                                      std::span<const Tensor> dw);

// Benches (`bench gemm`): from now on the CUDA grouped GEMMs run as one cuBLASLt GEMM per group
// (ops/cuda/linear.cpp, which takes set_gemm_algorithm_rank) instead of one
// cublasGemmGroupedBatchedEx per product — the alternative the grouped rows' %best is timed
// against. Returns the previous setting. The CPU (always one GEMM per group) ignores it.
bool set_grouped_gemm_per_group(bool per_group);       // ops/cpu/grouped_linear.cpp
bool set_grouped_gemm_per_group_cuda(bool per_group);  // ops/cuda/grouped_linear.cpp

// The same op on the GPU (ops/cuda/grouped_linear.cpp), and the entry points callers use: each
// runs on the backend of its first output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void grouped_linear_forward_cuda(const Tensor& x, std::span<const Tensor> w,
                                 std::span<const int64_t> offsets, const Tensor& y, bool accumulate,
                                 Stream& stream);
void grouped_linear_backward_cuda(const Tensor& x, std::span<const Tensor> w,
                                  std::span<const int64_t> offsets, const Tensor& dy,
                                  const Tensor& dx, bool accumulate_dx, std::span<const Tensor> dw,
                                  Stream& stream);
inline void grouped_linear_forward(const Tensor& x, std::span<const Tensor> w,
                                   std::span<const int64_t> offsets, const Tensor& y,
                                   bool accumulate, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(grouped_linear_forward, y, x, w, offsets, y, accumulate, stream);
}
inline void grouped_linear_backward(const Tensor& x, std::span<const Tensor> w,
                                    std::span<const int64_t> offsets, const Tensor& dy,
                                    const Tensor& dx, bool accumulate_dx,
                                    std::span<const Tensor> dw, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(grouped_linear_backward, dy, x, w, offsets, dy, dx, accumulate_dx, dw,
                        stream);
}

}  // namespace moepeak::ops
