// The blocked expert MLP of PipelinedLlepDispatch, one tile at a time (see llep_tile_mlp.h).
// Test: through ctest -R test_llep
#include "ops/schedules/llep_tile_mlp.h"

#include <algorithm>

#include "core/error.h"
#include "ops/bias.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace moepeak::schedules {
namespace {

// The first n * f elements of a (T, F_b) block buffer as an (n, f) matrix, f <= F_b (the last
// F block may be narrower than the others).
Tensor block_of(const Tensor& buffer, int64_t n, int64_t f) {
  return buffer.reshape(Shape{buffer.numel()}).rows(0, n * f).reshape(Shape{n, f});
}

void check_tile(const ExpertWeights& ex, int64_t ffn_block, const Tensor& x,
                const TileBlocks& blocks, bool backward) {
  const int64_t n = x.size(0), F = ex.w1.size(0);
  MOEPEAK_CHECK(ffn_block >= 1 && F >= 1 && blocks.a.numel() >= n * std::min(F, ffn_block) &&
                    blocks.b.numel() == blocks.a.numel() && blocks.g.numel() == blocks.a.numel() &&
                    (!backward || blocks.dg.numel() == blocks.a.numel()),
                "llep tile: ", n, " rows, F = ", F, " in blocks of ", ffn_block,
                " with block buffers ", blocks.a.str(), ", ", blocks.b.str(), ", ", blocks.g.str(),
                ", ", blocks.dg.str());
}

}  // namespace

void expert_tile_forward(const ExpertWeights& ex, const ops::SwigluParams& activation,
                         int64_t ffn_block, const Tensor& x, const TileBlocks& blocks,
                         const Tensor& y, Stream& stream) {
  check_tile(ex, ffn_block, x, blocks, false);
  const int64_t n = x.size(0), F = ex.w1.size(0);
  const bool bias = ex.has_biases();
  // NOTES: b2 first, once per row; every block then accumulates onto it.
  if (bias) ops::bias_broadcast(ex.b2, y, stream);
  for (int64_t f0 = 0; f0 < F; f0 += ffn_block) {
    const int64_t f1 = std::min(F, f0 + ffn_block), f = f1 - f0;
    const Tensor as = block_of(blocks.a, n, f), bs = block_of(blocks.b, n, f);  // (n, f)
    const Tensor gs = block_of(blocks.g, n, f);
    if (bias) {
      ops::bias_broadcast(ex.b1.rows(f0, f1), as, stream);
      ops::bias_broadcast(ex.b3.rows(f0, f1), bs, stream);
    }
    ops::linear_forward(x, ex.w1.rows(f0, f1), as, bias, stream);
    ops::linear_forward(x, ex.w3.rows(f0, f1), bs, bias, stream);
    ops::swiglu_forward(as, bs, activation, gs, stream);  // the plain op for the default
    ops::linear_forward_cols(gs, ex.w2, f0, y, f0 > 0 || bias, stream);
  }
}

void expert_tile_backward(const ExpertWeights& ex, const ops::SwigluParams& activation,
                          int64_t ffn_block, const Tensor& x, const Tensor& dout,
                          const Tensor& weight, const TileBlocks& blocks, const Tensor& dx,
                          const Tensor& dweight, Stream& stream) {
  check_tile(ex, ffn_block, x, blocks, true);
  const int64_t n = x.size(0), H = x.size(1), F = ex.w1.size(0);
  const bool bias = ex.has_biases();
  for (int64_t f0 = 0; f0 < F; f0 += ffn_block) {
    const int64_t f1 = std::min(F, f0 + ffn_block), f = f1 - f0;
    const Tensor as = block_of(blocks.a, n, f), bs = block_of(blocks.b, n, f);  // (n, f)
    const Tensor gs = block_of(blocks.g, n, f), dgs = block_of(blocks.dg, n, f);
    const Tensor w1 = ex.w1.rows(f0, f1), w3 = ex.w3.rows(f0, f1);  // (f, H)
    if (bias) {
      ops::bias_broadcast(ex.b1.rows(f0, f1), as, stream);
      ops::bias_broadcast(ex.b3.rows(f0, f1), bs, stream);
    }
    ops::linear_forward(x, w1, as, bias, stream);
    ops::linear_forward(x, w3, bs, bias, stream);
    ops::swiglu_forward(as, bs, activation, gs, stream);
    ops::linear_backward_cols(gs, ex.w2, f0, dout, dgs, false, Tensor(), stream);
    ops::row_dot(gs, dgs, dweight, f0 > 0, stream);
    ops::scale_rows(dgs, weight, stream);
    ops::scale_rows(gs, weight, stream);
    ops::linear_backward_cols(gs, ex.w2, f0, dout, Tensor(), false, ex.dw2, stream);
    ops::swiglu_backward(as, bs, dgs, activation, as, bs, stream);  // da, db in place of a, b
    if (bias) {
      if (ex.db1.defined()) ops::bias_backward(as, ex.db1.rows(f0, f1), stream);
      if (ex.db3.defined()) ops::bias_backward(bs, ex.db3.rows(f0, f1), stream);
    }
    ops::linear_backward(x, w1, as, dx, f0 > 0, ex.dw1.rows(f0, f1), stream);
    ops::linear_backward(x, w3, bs, dx, true, ex.dw3.rows(f0, f1), stream);
  }
  if (bias) {
    // NOTES: y's bias, once per row: dweight += dout . b2 (the blocks summed g . (dout w2), which
    // leaves it out), and db2 += dout^T weight, the column sums of dy = weight * dout — each a
    // GEMM with one column, so no (n, H) dy is formed.
    ops::linear_forward(dout, ex.b2.reshape(Shape{1, H}), dweight.reshape(Shape{n, 1}), true,
                        stream);
    if (ex.db2.defined()) {
      ops::linear_backward(weight.reshape(Shape{n, 1}), ex.b2.reshape(Shape{H, 1}), dout, Tensor(),
                           false, ex.db2.reshape(Shape{H, 1}), stream);
    }
  }
}

}  // namespace moepeak::schedules
