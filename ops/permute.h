// permute: expert dispatch and combine of the standard schedule. Routed (token, expert) pairs are
// laid out expert by expert; `index` maps each routed row back to its token.
//
//   gather_rows:          src (N, H), index (M) i32, dst (M, H)       dst[i] = src[index[i]]   (=)
//   scatter_add_rows:     src (M, H), index (M) i32, dst (N, H)       dst[index[i]] += src[i]  (+=)
//   combine_rows:         y (M, H), index (M) i32, weight (M), out (N, H)
//                                                      out[index[i]] += weight[i] * y[i]       (+=)
//   combine_rows_backward: dout (N, H), y (M, H), index (M) i32, weight (M),
//                          dy (M, H)     dy[i] = weight[i] * dout[index[i]]                    (=)
//                          dweight (M)   dweight[i] = sum_h dout[index[i], h] * y[i, h]        (=)
//
// Float tensors share one dtype (f32 | bf16 | f64, both backends). The additions run in increasing
// i, so a token that several experts (or chunks) send back sums them in a fixed order: bitwise
// reproducible. The dweight dot products accumulate in double; dy may be y itself (each row of y
// is read before it is overwritten). An index outside [0, N) makes the stream task throw a
// moepeak::Error naming the position and the index (it surfaces at synchronize()); every index is
// checked before anything is written. M == 0 is allowed.
//
// CUDA (ops/cuda/permute.cu): f32 | bf16 storage (f64 too), fp32 arithmetic (f64 for f64), the
// dweight dot products in double. scatter_add_rows and combine_rows are deterministic without
// atomics: each block owns a range of destination rows, scans index in increasing i and applies
// the rows that land in its range in that order, each column by one thread, so every element
// sees the CPU's additions in the CPU's order (bitwise reproducible run to run; with bf16 storage
// consecutive positions on one row are summed in fp32 and rounded once, other additions round to
// bf16 each, as += in the storage dtype does; which positions count as consecutive depends on the
// grid, i.e. on the GPU's SM count, so bf16 sums repeat run to run on one GPU model but may
// differ in the last bits between models). The index is not checked on the GPU
// (a check would need a host sync) and nothing throws: a position whose index is outside [0, N)
// is skipped — scatter_add_rows and combine_rows add nothing for it, gather_rows writes zeros to
// dst[i], combine_rows_backward writes zeros to dy[i] and dweight[i].
//
// CPU with bf16 storage (ops/cpu/permute.cpp): fp32 arithmetic, the CUDA rule above for a grid
// of one block that owns every destination row: a run of consecutive positions i (within one
// chunk of 256 positions, the CUDA block size) with one index is summed in fp32 onto the row and
// rounded to bf16 once; every other addition rounds to bf16. CUDA's runs contain the CPU's (its
// blocks own fewer rows, so hits of one row can be consecutive in its list with other rows'
// positions between them), so the two agree bitwise where no CUDA run is longer than the CPU's
// (e.g. N = 1, or no row hit twice within a chunk) and otherwise differ only by where the
// bf16 roundings fall. gather_rows copies the elements; combine_rows_backward computes dy =
// w * dout[index[i]] in fp32 and rounds once, and dweight's double dot is rounded to fp32 and
// then to bf16, as on CUDA. CUDA against the CPU: tests/ops/backend_ops/cases_permute.cpp; the
// CPU's bf16 rule: tests/ops/test_moe_ops.cpp (Bf16Storage).
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void gather_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream);
void scatter_add_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst,
                          Stream& stream);
void combine_rows_cpu(const Tensor& y, const Tensor& index, const Tensor& weight, const Tensor& out,
                      Stream& stream);
void combine_rows_backward_cpu(const Tensor& dout, const Tensor& y, const Tensor& index,
                               const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                               Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_gather_rows_args(const char* op, const Tensor& src, const Tensor& index,
                            const Tensor& dst);
void check_scatter_add_rows_args(const char* op, const Tensor& src, const Tensor& index,
                                 const Tensor& dst);
void check_combine_rows_args(const char* op, const Tensor& y, const Tensor& index,
                             const Tensor& weight, const Tensor& out);
void check_combine_rows_backward_args(const char* op, const Tensor& dout, const Tensor& y,
                                      const Tensor& index, const Tensor& weight, const Tensor& dy,
                                      const Tensor& dweight);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void gather_rows_cuda(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream);
void scatter_add_rows_cuda(const Tensor& src, const Tensor& index, const Tensor& dst,
                           Stream& stream);
void combine_rows_cuda(const Tensor& y, const Tensor& index, const Tensor& weight,
                       const Tensor& out, Stream& stream);
void combine_rows_backward_cuda(const Tensor& dout, const Tensor& y, const Tensor& index,
                                const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                                Stream& stream);
inline void gather_rows(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(gather_rows, dst, src, index, dst, stream);
}
inline void scatter_add_rows(const Tensor& src, const Tensor& index, const Tensor& dst,
                             Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(scatter_add_rows, dst, src, index, dst, stream);
}
inline void combine_rows(const Tensor& y, const Tensor& index, const Tensor& weight,
                         const Tensor& out, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(combine_rows, out, y, index, weight, out, stream);
}
inline void combine_rows_backward(const Tensor& dout, const Tensor& y, const Tensor& index,
                                  const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                                  Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(combine_rows_backward, dy, dout, y, index, weight, dy, dweight, stream);
}

}  // namespace moepeak::ops
