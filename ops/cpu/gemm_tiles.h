// gemm_tiles: the CPU's mixed-precision GEMM behind bf16 storage in ops/linear.h, ops/matmul.h
// and ops/grouped_linear.h: bf16 A and B, fp32 arithmetic, bf16 or f32 C, with the CUDA path's
// rounding (cuBLASLt: bf16 storage, fp32 accumulation, one rounding to bf16 per output element
// per call, ops/cuda/linear.cpp).
//
//   gemm_bf16(trans_a, trans_b, rows, cols, inner, a, lda, b, ldb, accumulate, c, ldc)
//     C (rows, cols) = op(A) op(B)          accumulate = false (C is not read: NaN is overwritten)
//     C (rows, cols) = op(A) op(B) + C      accumulate = true
//   row-major with leading dimensions (elements between consecutive rows):
//     op(A) (rows, inner): A is (rows, inner), or (inner, rows) read transposed with trans_a
//     op(B) (inner, cols): B is (inner, cols), or (cols, inner) read transposed with trans_b
//     C (rows, cols), bf16 or f32
//   Precision: every product and sum in fp32 (OpenBLAS sgemm on fp32 copies of the bf16 inputs,
//   which are exact). A bf16 C is rounded to nearest even once per element per call: the fp32 sum
//   over all of `inner`, plus the old value read from bf16 with accumulate, rounded once. An f32
//   C is accumulated in place in fp32 (the fp32 main gradient, dw += dy^T x): no bf16 rounding.
//   Empty sizes: rows == 0 or cols == 0 does nothing; inner == 0 writes zeros (leaves C with
//   accumulate), as the f32 path does (ops/cpu/linear.cpp).
//   Reproducible run to run: the tiling is a function of (rows, cols, inner, C's dtype) only, the
//   tiles run in a fixed order on the calling thread, and each sgemm call is OpenBLAS's, which
//   with a fixed thread count reduces in a fixed order (ops/linear.h).
//
// How (why it is fast): the problem is cut into row tiles (mc), column tiles (nc) and inner
// panels (kc). A tile of A (mc x kc) and a panel of B (kc x nc) are widened to fp32 in scratch
// (exact: a shift), one sgemm multiplies them on OpenBLAS's threads, and C's tile is accumulated
// in fp32 over the inner panels: in place for an f32 C, in an fp32 tile (mc x nc) of the scratch
// for a bf16 C, which is then rounded into C once. The widening and rounding run on the calling
// thread between sgemm calls, so their element count is the cost over f32: gemm_tile_plan picks
// the tile sizes and loop order with the fewest element copies (its own widening, OpenBLAS's
// repacking inside each call, C passes, per-call overhead). A B panel (or A tile) that covers a
// whole extent is widened once and reused over every row (column) tile; for the training shapes
// of configs/small.toml (tokens 4096, hidden 512, experts 1024 x 512) every A and B element is
// widened exactly once, except the LM head's forward (x widened 4 times, for 4 column tiles of
// the 4096-column output) and input gradient (the weight, 1/8 of dy's size, 8 times).
//
// NOTES: the scratch is one thread-local buffer of kGemmTileScratchBytes per calling thread (a
// stream's worker), allocated at its first bf16 GEMM and kept: it never grows with the problem,
// as a GPU kernel keeps its tiles in shared memory (ops/op_common.h). Every plan fits it.
// Results depend on neither the leading dimensions nor the operands' alignment (sgemm only ever
// sees the dense tiles in the aligned scratch), so a column block of w (the _cols ops of
// ops/linear.h) gives bitwise the plain op's result on a copy of the block. The widening and
// rounding stay on the calling thread: OpenBLAS's workers spin for a while after each call, and
// a helper thread converting the other half of each tile made no measurable difference.
// Test: ctest -R test_gemm_bf16 (and test_backend_ops_cpu's bf16 linear/matmul cases).
#pragma once

#include <cstdint>

#include "core/runtime/dtype.h"

namespace moepeak::ops {

// fp32 scratch per calling thread: A tile + B panel + fp32 C tile (bf16 C only).
constexpr int64_t kGemmTileScratchFloats = int64_t{3} << 19;           // 1.5 Mi floats
constexpr int64_t kGemmTileScratchBytes = kGemmTileScratchFloats * 4;  // 6 MiB

struct GemmTilePlan;

// `plan` (tests only) replaces gemm_tile_plan's choice: tiles of any size >= 1 that fit the
// scratch, and a bf16 C needs kc >= inner unless the order is c_tile (else moepeak::Error).
void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, bool accumulate, bf16* c, int64_t ldc,
               const GemmTilePlan* plan = nullptr);
void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t inner, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, bool accumulate, float* c, int64_t ldc,
               const GemmTilePlan* plan = nullptr);

// The tiling gemm_bf16 runs for a shape (exposed for tests, which check that a shape spans more
// than one tile in every dimension, and for benches).
struct GemmTilePlan {
  enum class Order {
    b_panel,  // column tiles, inner panels, row tiles: a B panel is widened once per column tile
    a_panel,  // row tiles, inner panels, column tiles: an A tile is widened once per row tile
    c_tile,   // row tiles, column tiles, inner panels: both re-widened, C's tile stays in fp32
  };
  Order order = Order::c_tile;
  int64_t mc = 0, nc = 0, kc = 0;  // tile rows, tile columns, panel depth (each >= 1)
  int64_t scratch_floats(bool bf16_c) const { return mc * kc + kc * nc + (bf16_c ? mc * nc : 0); }
};
// rows, cols, inner >= 1. A bf16 C always has kc = inner unless order is c_tile.
GemmTilePlan gemm_tile_plan(int64_t rows, int64_t cols, int64_t inner, bool bf16_c);

}  // namespace moepeak::ops
