// The blocked expert MLP of PipelinedLlepDispatch (dispatch_pipelined_llep.h): one expert over one
// tile of n <= T of its rows, its F columns in blocks fb = [f0, f1) of at most F_b, so the F-wide
// temporaries live as (T, F_b) blocks, never (T, F). With the expert's biases (gpt-oss) and the
// dispatcher's activation act (ops::SwigluParams; the plain SwiGLU by default):
//
//   ex      the expert: w1, w3 (F, H), w2 (H, F); b1, b3 (F), b2 (H) if ex.has_biases();
//           backward: dw1, dw3, dw2 (and db1, db3, db2) accumulated (+=)
//   x       (n, H)  the tile's rows, storage dtype
//   blocks  a, b, g (forward) and dg (backward): (T, F_b) buffers, T >= n, storage dtype
//   forward:  y (n, H) = sum over fb of act(a_fb, b_fb) w2[:, fb]^T (+ b2)             (written, =)
//             a_fb = x w1[fb]^T (+ b1[fb]), b_fb = x w3[fb]^T (+ b3[fb])
//   backward: dout (n, H) the tile's output gradients, weight (n) their routing weights (the
//             combine's dy = weight * dout is never formed); a_fb, b_fb, g_fb recomputed:
//             dweight (n) = sum over fb of g_fb . (dout w2[:, fb]) (+ dout . b2)        (written,
//             =)
//               (= dout . y: y itself is never formed)
//             dg = weight * (dout w2[:, fb]), dw2[:, fb] += dout^T (weight * g_fb)
//             (da, db) = act'(a_fb, b_fb, dg), dw1[fb] += da^T x, dw3[fb] += db^T x
//             dx (n, H) = sum over fb of da w1[fb] + db w3[fb]                          (written,
//             =) biases: db1[fb] += column sums of da, db3[fb] += of db (per block: each column
//             once), db2 += dout^T weight (the column sums of dy) once per tile, not per block
//   y, dx, dweight: the tile accumulators, main_grad_dtype (fp32 beside bf16: summed over the
//   blocks in fp32 and rounded once by the caller).
//
// A biased projection is ops::bias_broadcast into its block, then the GEMM accumulating onto it
// (one rounding of x W^T + b, ops/bias.h); b2 is broadcast into y before the first block, which
// then accumulates like the others, so it is added exactly once per row; the b2 terms of
// backward are two GEMMs with one column (dweight += dout b2, db2 += dout^T weight). Without
// biases and with the plain activation every call is the one PipelinedLLEP made before biases
// existed, so its results are bitwise unchanged.
// Test: through tests/parallel/test_llep_gpt_oss.cpp (against the standard dispatchers, biased
// and clamped) and tests/parallel/test_llep.cpp (unbiased).
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

// A tile's (T, F_b) block buffers (views of the dispatcher's; dg for backward only).
struct TileBlocks {
  Tensor a, b, g, dg;
};

void expert_tile_forward(const ExpertWeights& ex, const ops::SwigluParams& activation,
                         int64_t ffn_block, const Tensor& x, const TileBlocks& blocks,
                         const Tensor& y, Stream& stream);
void expert_tile_backward(const ExpertWeights& ex, const ops::SwigluParams& activation,
                          int64_t ffn_block, const Tensor& x, const Tensor& dout,
                          const Tensor& weight, const TileBlocks& blocks, const Tensor& dx,
                          const Tensor& dweight, Stream& stream);

}  // namespace moepeak::schedules
