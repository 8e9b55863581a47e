// The standard expert dispatch (the reference PipelinedLLEP is held to): every routed token is
// permuted into expert order at once, each expert runs its SwiGLU GEMMs on its rows (with the
// experts' biases, if they have them, and the dispatcher's activation), and the weighted outputs
// are combined back. The `dispatch` live set holds all N*k routed rows (biases add no buffer).
//
//   x       (N, H)   normalised hidden states (the MoE input)
//   index   (N, k)   i32 top-k experts per token, weight (N, k) their renormalised weights
//   out     (N, H)   += sum_j weight[n, j] * expert_{index[n, j]}(x[n])
//
// Row order inside an expert is token order, and the combine adds a token's k contributions in
// expert order, so per-token outputs do not depend on how the tokens are cut into chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

// Peak bytes of the `dispatch` live set for N tokens with top-k routing on one rank (M = N*k
// rows): the larger of the forward peak (x_rows, y_rows (M, H); a, b, g (M, F); permutation) and
// the backward peak (x_rows, dy, dx_rows (M, H); a, b, g, dg, da, db (M, F); permutation and
// row-weight gradient), each buffer rounded to the arena's alignment, plus what the other
// layers keep from forward to backward when `layers_resident` layers hold their activations at
// once (1 under gradient checkpointing, L without). Tests hold the measured peak to it; the
// planner uses it.
uint64_t dispatch_standard_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                 DType dtype, int64_t layers_resident);

// The experts' SwiGLU MLPs over rows grouped by expert, all experts at once: expert e owns rows
// [offsets[e], offsets[e + 1]) of every row tensor (offsets: E + 1 host offsets from 0 to R, an
// expert with no rows owns none), and each projection is one ops::grouped_linear call over all
// experts (one cuBLAS grouped GEMM on CUDA; on the CPU the same GEMMs as a loop over experts,
// so results are bitwise those of running each expert on its rows). act is the SwiGLU of
// `activation` (ops/swiglu.h: the plain one by default, gpt-oss's clamped form).
//   forward:   a = x w1^T (+ b1), b = x w3^T (+ b3), g = act(a, b), y = g w2^T (+ b2)
//              (all written, =)
//   backward:  g recomputed from a, b; dg = dy w2, (da, db) = act'(a, b, dg),
//              dx = da w1 + db w3 (written, =); dw2 += dy^T g, dw1 += da^T x, dw3 += db^T x;
//              with biases db2 += column sums of dy, db1 += of da, db3 += of db
//   x, y, dy, dx (R, H); a, b, g, dg, da, db (R, F); experts: E entries, their gradients as given
//   (an undefined dw or db skips that gradient, as in ops::linear_backward).
// With biases (ExpertWeights::has_biases of experts[0]; check_expert_biases holds them alike),
// each biased projection is ops::grouped_bias_broadcast into its output, then the grouped GEMM
// accumulating onto it (one rounding of x W^T + b, ops/bias.h); without them the calls are those
// of the unbiased MLP, so its results are bitwise unchanged.
// Shared by the dispatchers that hold every routed row at once (standard, expert parallel, LLEP).
void all_experts_forward(const std::vector<ExpertWeights>& experts,
                         const std::vector<int64_t>& offsets, const ops::SwigluParams& activation,
                         const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& g,
                         const Tensor& y, Stream& stream);
void all_experts_backward(const std::vector<ExpertWeights>& experts,
                          const std::vector<int64_t>& offsets, const ops::SwigluParams& activation,
                          const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& dy,
                          const Tensor& g, const Tensor& dg, const Tensor& da, const Tensor& db,
                          const Tensor& dx, Stream& stream);

class StandardDispatch final : public ExpertDispatch {
 public:
  // `activation`: the experts' SwiGLU (default: the plain one).
  StandardDispatch(Backend& backend, Stream& stream, DType dtype,
                   const ops::SwigluParams& activation = {});

  // Forward: out += MoE(x). Keeps what backward needs until backward() or release().
  void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
               const std::vector<ExpertWeights>& experts, const Tensor& out) override;
  // Backward from dout (N, H): dx (N, H) +=, dweight (N, k) =, expert weight grads +=.
  void backward(const Tensor& dout, const std::vector<ExpertWeights>& experts, const Tensor& dx,
                const Tensor& dweight) override;
  void release() override;

  // Tokens each expert received in the last forward (for load statistics).
  const std::vector<int64_t>& expert_counts() const override { return counts_; }

 private:
  Backend& backend_;
  Stream& stream_;
  DType dtype_;
  ops::SwigluParams activation_;
  int64_t tokens_ = 0, top_k_ = 0;
  std::vector<int64_t> counts_, offsets_;
  OwnedTensor row_token_, row_slot_, row_weight_;  // (M) permutation
  OwnedTensor x_rows_, a_, b_, y_rows_;            // (M, H), (M, F), (M, F), (M, H)
};

}  // namespace moepeak::schedules
