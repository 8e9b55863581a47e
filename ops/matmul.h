// matmul: a plain row-major product C = A B, written or accumulated. Ring-DTP uses it for the
// LM head's input gradient over one vocabulary strip, dX += G W_strip, where linear_backward
// would also form dW in the same task (Ring-DTP sends one of the two accumulators to the next
// rank while the other GEMM still runs, so it needs them as separate stream tasks).
//
//   a: (M, K) f32 | bf16 | f64 (on both backends)
//   b: (K, N) same dtype
//   c: (M, N) same dtype, or f32 when a is bf16 (an fp32 accumulator: Ring-DTP sums dX over
//      strips and rounds in fp32), c = a b, written (=) or, with accumulate, added (+=)
//
// Empty sizes are allowed: M == 0 or N == 0 does nothing; K == 0 writes zeros (or leaves c
// unchanged with accumulate), so a NaN-poisoned output is still overwritten. GEMMs are OpenBLAS
// CBLAS (sgemm / dgemm; bf16 storage through ops/cpu/gemm_tiles.h) on the CPU and cuBLASLt on
// CUDA (ops/cuda/matmul.cpp; K == 0 is a cudaMemset of c), with the precision, scratch,
// workspace and reproducibility of ops/linear.h: bf16 storage has fp32 arithmetic and one
// rounding of c to bf16 per call on both (none for an f32 c).
//
// Test: ctest -R test_ring_dtp_ops (CPU); ctest -R test_gemm_bf16 (CPU bf16); ctest -R
// test_backend_ops (both backends, cases in tests/ops/backend_ops/cases_matmul.cpp).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate, Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_matmul_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& c);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void matmul_cuda(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
                 Stream& stream);
inline void matmul(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
                   Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(matmul, c, a, b, c, accumulate, stream);
}

}  // namespace moepeak::ops
