// copy_2d: copies a block of `rows` x `width` elements between the flat storage of two tensors,
// each row at its own pitch — the pack and unpack of the Ulysses head exchange
// (ops/schedules/ulysses.cpp), where one rank's heads are a column block of (tokens, heads, d).
//
//   src: any shape, any dtype; read    src.flat[src_offset + i * src_pitch + j]
//   dst: same dtype;           written dst.flat[dst_offset + i * dst_pitch + j]
//        for i < rows, j < width  (offsets, pitches and width in elements)
//
// Both tensors must hold every element the block touches (checked: offset + (rows - 1) * pitch
// + width <= numel) and the pitches must be >= width, so rows of one side never overlap; src and
// dst must not overlap each other. rows == 0 or width == 0 copies nothing. Any dtype (the bytes
// are copied). Both tensors on the same backend; device or pinned host memory on either side.
// CPU: one memcpy per row, enqueued on the stream. CUDA (ops/cuda/copy_2d.cpp): one
// cudaMemcpy2DAsync on the stream (the direction inferred from the pointers).
//
// Test: ctest -R test_backend_ops (both backends; cases in
// tests/ops/backend_ops/cases_copy_2d.cpp), ctest -R ulysses (the exchange built on it, 2 and 4
// ranks).
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// A block of rows x width elements at `offset` with `pitch` elements between row starts.
struct Block2d {
  int64_t offset = 0;
  int64_t pitch = 0;
};

// The checks both backends run at the call (throw moepeak::Error naming `op` and the numbers).
void check_copy_2d_args(const char* op, const Tensor& src, Block2d from, const Tensor& dst,
                        Block2d to, int64_t rows, int64_t width);

void copy_2d_cpu(const Tensor& src, Block2d from, const Tensor& dst, Block2d to, int64_t rows,
                 int64_t width, Stream& stream);
void copy_2d_cuda(const Tensor& src, Block2d from, const Tensor& dst, Block2d to, int64_t rows,
                  int64_t width, Stream& stream);
inline void copy_2d(const Tensor& src, Block2d from, const Tensor& dst, Block2d to, int64_t rows,
                    int64_t width, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(copy_2d, dst, src, from, dst, to, rows, width, stream);
}

}  // namespace moepeak::ops
