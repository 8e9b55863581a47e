// grouped_bias: ops/bias.h for the experts of one MoE layer in one call. The rows of y (dy) are
// grouped by expert (contiguous blocks, as ops/grouped_linear.h lays them out) and group g has
// its own bias:
//
//   biases:  G tensors (N), one dtype f32 | bf16 | f64, G >= 1 (both backends)
//   offsets: G + 1 host row offsets, offsets[0] = 0 <= offsets[1] <= ... <= offsets[G] = M;
//            group g owns rows [offsets[g], offsets[g + 1]) (an empty group owns none)
//   y:       (M, N)  y[g rows] = biases[g], each row                              (written, =)
//            the biases' dtype, or f32 when they are bf16
//   dy:      (M, N)
//   dbiases: G entries: dbiases[g] (N) += sum over g's rows of dy         (accumulated, +=)
//            an undefined dbiases[g] skips that group; dy's dtype, or f32 when dy is bf16
//
// It computes exactly what the loop over groups of ops/bias.h computes,
//   for g: bias_broadcast(biases[g], y.rows(o[g], o[g+1]))
//   for g: bias_backward(dy.rows(o[g], o[g+1]), dbiases[g])
// and that loop is the implementation on both backends (CPU: ops/cpu/bias.cpp; CUDA:
// ops/cuda/grouped_bias.cpp, one launch of ops/cuda/bias.cu's kernels per non-empty group):
// results are bitwise the per-expert calls', an empty group writes nothing and leaves its dbias
// unchanged. (Kept apart from ops/bias.h because std::span is C++20 and the .cu files compile as
// C++17.)
// Test: tests/ops/test_gpt_oss_ops.cpp (CPU: bitwise the per-group loop, argument errors);
// tests/ops/backend_ops/cases_bias.cpp (each backend against the f64 CPU reference).
#pragma once

#include <cstdint>
#include <span>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void grouped_bias_broadcast_cpu(std::span<const Tensor> biases, std::span<const int64_t> offsets,
                                const Tensor& y, Stream& stream);
void grouped_bias_backward_cpu(const Tensor& dy, std::span<const int64_t> offsets,
                               std::span<const Tensor> dbiases, Stream& stream);

// The checks both backends run at the call (defined in ops/cpu/bias.cpp; each throws
// moepeak::Error naming `op`, the group and the mismatch).
// G = biases.size() >= 1 biases (N) of one dtype, y (M, N) as above, G + 1 offsets as above.
void check_grouped_bias_broadcast_args(const char* op, std::span<const Tensor> biases,
                                       std::span<const int64_t> offsets, const Tensor& y);
// dy (M, N), G + 1 offsets, G = dbiases.size() >= 1 entries, each undefined or (N) as above.
void check_grouped_bias_backward_args(const char* op, const Tensor& dy,
                                      std::span<const int64_t> offsets,
                                      std::span<const Tensor> dbiases);

// The same ops on the GPU (ops/cuda/grouped_bias.cpp), and the entry points callers use: each
// runs on the backend of y's (dy's) memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void grouped_bias_broadcast_cuda(std::span<const Tensor> biases, std::span<const int64_t> offsets,
                                 const Tensor& y, Stream& stream);
void grouped_bias_backward_cuda(const Tensor& dy, std::span<const int64_t> offsets,
                                std::span<const Tensor> dbiases, Stream& stream);
inline void grouped_bias_broadcast(std::span<const Tensor> biases, std::span<const int64_t> offsets,
                                   const Tensor& y, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(grouped_bias_broadcast, y, biases, offsets, y, stream);
}
inline void grouped_bias_backward(const Tensor& dy, std::span<const int64_t> offsets,
                                  std::span<const Tensor> dbiases, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(grouped_bias_backward, dy, dy, offsets, dbiases, stream);
}

}  // namespace moepeak::ops
