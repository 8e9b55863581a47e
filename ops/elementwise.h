// elementwise: small whole-tensor helpers for residual adds, gradient scaling and clipping, and
// copies between activation buffers.
//
//   add_cpu(a, b, out)      out = a + b; a, b, out of one shape and float dtype; out may be a or b
//                                                                                   (written, =)
//   scale_cpu(x, alpha)     x *= alpha in place, in x's compute type (alpha rounded to it first)
//   sum_squares_cpu(x, out) out[p] += sum over part p of x[i]^2; x float of any shape, out (P)
//                           f64, P >= 1: x (flattened) is cut into P parts of c = ceil(n / P)
//                           elements, part p = [p c, min(n, (p + 1) c)) (the last ones may be
//                           short or empty). Each part's sum is accumulated in double in index
//                           order and then added to out[p], so a tensor's contribution does not
//                           depend on what out held; the caller adds out[0..P) in order (global
//                           gradient norms: P = kSumSquaresParts, one GPU block a part)   (+=)
//   copy_cpu(src, dst)      dst = src; same shape and dtype, any dtype          (written, =)
//   scale_rows_cpu(x, w)    x[i, :] *= w[i]; x (M, C) float, w (M) of x's dtype     (in place)
//   row_dot_cpu(a, b, out, accumulate)
//                           out[i] (+)= sum_c a[i, c] * b[i, c]; a, b (M, C), out (M), one
//                           float dtype (or an f32 out beside bf16 a, b: an fp32 accumulator
//                           over several calls); each dot accumulated in double in c order,
//                           then rounded to out's dtype and written (=) or added (+=)
// (the two halves of combine_rows_backward for rows already in order, used per F block by the
// blocked expert MLP of ops/schedules/dispatch_pipelined_llep.cpp)
//
// "float" is f32 | bf16 | f64 storage on both backends: arithmetic in fp32 for f32 and bf16 (f64
// for f64), each element read once into it and every output rounded once to the storage type
// (sum_squares squares and sums in double and writes f64, so bf16 x adds no rounding). On the
// CPU (ops/cpu/elementwise.cpp) a bf16 result is therefore the f32 result on the same (bf16)
// values rounded once to bf16: add = bf16(a + b), scale = bf16(x * fp32(alpha)), scale_rows =
// bf16(x * w), row_dot = bf16(fp32(dot)) or bf16(out + fp32(dot)); copy copies the bytes.
//
// CUDA (ops/cuda/elementwise.cu): the same arithmetic, so with f32 or bf16 storage add, scale and
// scale_rows are the CPU's results bit for bit (NaN payloads aside).
//   add           grid-stride; out may be a or b
//   scale         alpha rounded to the compute type (fp32 for bf16 storage, not to bf16)
//   sum_squares   deterministic without atomics: one block of 512 threads per part sums it in
//                 double (16-byte loads) and its thread 0 adds the sum to out[p]; the order of
//                 additions depends only on x's length, alignment and P, so the result is
//                 reproducible run to run (not bitwise the CPU's index order). P = 1 is one
//                 block, one SM's share of the memory bandwidth; kSumSquaresParts blocks fill
//                 the GPU, and the caller's host sum of the P partials is the second pass
//   copy          cudaMemcpyAsync (cudaMemcpyDefault, so src may also be pinned host memory);
//                 src and dst must not partially overlap
//   scale_rows    a block per row
//   row_dot       a block per row; the dot in double (a block reduction, not c order), rounded
//                 to the compute type, then written or added to out[i] and rounded once
// Test: tests/ops/test_dense_ops.cpp (CPU; Bf16Storage: bf16 bitwise against f32),
// tests/ops/backend_ops/cases_elementwise.cpp (each backend against the f64 CPU reference).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// The parts a global sum of squares is cut into (the trainer's gradient norm): enough GPU blocks
// to fill an H100/H200 (132 SMs) twice over, 2 KiB of partials.
constexpr int64_t kSumSquaresParts = 256;

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream);
void scale_cpu(const Tensor& x, double alpha, Stream& stream);
void sum_squares_cpu(const Tensor& x, const Tensor& out, Stream& stream);
void copy_cpu(const Tensor& src, const Tensor& dst, Stream& stream);
void scale_rows_cpu(const Tensor& x, const Tensor& weight, Stream& stream);
void row_dot_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                 Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`);
// each backend then rejects the dtypes it does not run (scale has no other check).
void check_add_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& out);
void check_sum_squares_args(const char* op, const Tensor& out);
void check_copy_args(const char* op, const Tensor& src, const Tensor& dst);
void check_scale_rows_args(const char* op, const Tensor& x, const Tensor& weight);
void check_row_dot_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& out);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void add_cuda(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream);
void scale_cuda(const Tensor& x, double alpha, Stream& stream);
void sum_squares_cuda(const Tensor& x, const Tensor& out, Stream& stream);
void copy_cuda(const Tensor& src, const Tensor& dst, Stream& stream);
void scale_rows_cuda(const Tensor& x, const Tensor& weight, Stream& stream);
void row_dot_cuda(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                  Stream& stream);
inline void add(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(add, out, a, b, out, stream);
}
inline void scale(const Tensor& x, double alpha, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(scale, x, x, alpha, stream);
}
inline void sum_squares(const Tensor& x, const Tensor& out, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(sum_squares, x, x, out, stream);
}
inline void copy(const Tensor& src, const Tensor& dst, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(copy, dst, src, dst, stream);
}
inline void scale_rows(const Tensor& x, const Tensor& weight, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(scale_rows, x, x, weight, stream);
}
inline void row_dot(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                    Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(row_dot, out, a, b, out, accumulate, stream);
}

}  // namespace moepeak::ops
