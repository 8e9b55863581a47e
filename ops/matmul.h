// matmul: a plain row-major product C = A B, written or accumulated. Ring-DTP uses it for the
// LM head's input gradient over one vocabulary strip, dX += G W_strip, where linear_backward
// would also form dW in the same task (Ring-DTP sends one of the two accumulators to the next
// rank while the other GEMM still runs, so it needs them as separate stream tasks).
//
//   a: (M, K) f32 | f64
//   b: (K, N) same dtype
//   c: (M, N) same dtype   c = a b, written (=) or, with accumulate, added (+=)
//
// Empty sizes are allowed: M == 0 or N == 0 does nothing; K == 0 writes zeros (or leaves c
// unchanged with accumulate), so a NaN-poisoned output is still overwritten. GEMMs are OpenBLAS
// CBLAS (sgemm / dgemm), as in ops/linear.h.
//
// Test: ctest -R test_ring_dtp_ops
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
                Stream& stream);

}  // namespace moepeak::ops
