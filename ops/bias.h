// bias: the additive bias of a linear layer, y = x W^T + b (gpt-oss's attention projections,
// router and experts carry one; ops/linear.h has none), and its gradient.
//
//   bias:  (N)    f32 | bf16 | f64 (both backends)
//   y:     (M, N) y[m, :] = bias for every row m                              (written, =)
//                 bias's dtype, or f32 when bias is bf16 (an fp32 accumulator)
//   dy:    (M, N) f32 | bf16 | f64
//   dbias: (N)    dbias[n] += sum_m dy[m, n]                                  (accumulated, +=)
//                 dy's dtype, or f32 when dy is bf16 (the fp32 main gradient, as ops/rmsnorm.h's
//                 dw: the column sum is rounded to fp32 and added in fp32, no bf16 rounding)
//
// The biased linear is two calls:
//   bias_broadcast(b, y);  linear_forward(x, W, y, /*accumulate=*/true);
// the broadcast copies b exactly (a bf16 b widened to an f32 y is exact), and the accumulating
// GEMM reads y, adds x W^T to it in fp32 and rounds once (ops/linear.h), so a bf16 y is
// round(x W^T + b) with one rounding, as torch's addmm rounds it; f32 and f64 likewise. Its
// backward is linear_backward for dx and dW and bias_backward(dy, db).
//
// Precision: the broadcast does no arithmetic. The backward sums each column in double and
// rounds the total once to dbias's compute type (fp32 for f32 and bf16 dbias, double for f64),
// adds it to dbias in that type and stores it (one bf16 rounding for a bf16 dbias).
// M == 0 is allowed: y has no rows, and dbias is left unchanged (not even a += 0).
// CPU (ops/cpu/bias.cpp): the column sum runs over rows in increasing m, so results are bitwise
// reproducible; a bf16 run is the f32 run on the same (bf16) values rounded once.
// CUDA (ops/cuda/bias.cu): the broadcast is a grid-stride copy. The backward is deterministic
// without atomics (as ops/rmsnorm.h's dw): a block owns 32 columns, 16 row lanes each sum rows
// l, l + 16, ... in double, one thread adds the lane sums in lane order and adds the total to
// dbias[n] once, so results are reproducible run to run, though not bitwise the CPU's m order.
// The grouped forms for the experts (rows grouped by expert): ops/grouped_bias.h.
//
// Test: tests/ops/test_gpt_oss_ops.cpp (CPU, float64 references, bf16 bitwise against f32);
// tests/ops/backend_ops/cases_bias.cpp (each backend against the f64 CPU reference).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void bias_broadcast_cpu(const Tensor& bias, const Tensor& y, Stream& stream);
void bias_backward_cpu(const Tensor& dy, const Tensor& dbias, Stream& stream);

// The checks both backends run at the call (defined in ops/cpu/bias.cpp; each throws
// moepeak::Error naming `op`).
void check_bias_broadcast_args(const char* op, const Tensor& bias, const Tensor& y);
void check_bias_backward_args(const char* op, const Tensor& dy, const Tensor& dbias);

// The same ops on the GPU (ops/cuda/bias.cu), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void bias_broadcast_cuda(const Tensor& bias, const Tensor& y, Stream& stream);
void bias_backward_cuda(const Tensor& dy, const Tensor& dbias, Stream& stream);
inline void bias_broadcast(const Tensor& bias, const Tensor& y, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(bias_broadcast, y, bias, y, stream);
}
inline void bias_backward(const Tensor& dy, const Tensor& dbias, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(bias_backward, dbias, dy, dbias, stream);
}

}  // namespace moepeak::ops
