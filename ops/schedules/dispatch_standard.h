// The standard expert dispatch (the reference PipelinedLLEP is held to): every routed token is
// permuted into expert order at once, each expert runs its SwiGLU GEMMs on its rows, and the
// weighted outputs are combined back. The `dispatch` live set holds all N*k routed rows.
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

namespace moepeak::schedules {

// One expert's weights: w1, w3 (F, H), w2 (H, F), and their gradients (accumulated).
struct ExpertWeights {
  Tensor w1, w2, w3;
  Tensor dw1, dw2, dw3;
};

// Bytes the standard dispatch holds for N tokens with top-k routing: the permuted input and the
// output rows (N*k, H), the SwiGLU activations a, b (N*k, F) kept for backward, plus the
// permutation (N*k i32 token, slot and weight). Used by the planner and by tests against the
// measured peak.
uint64_t dispatch_standard_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                 DType dtype);

class StandardDispatch {
 public:
  StandardDispatch(Backend& backend, Stream& stream, DType dtype);

  // Forward: out += MoE(x). Keeps what backward needs until backward() or release().
  void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
               const std::vector<ExpertWeights>& experts, const Tensor& out);
  // Backward from dout (N, H): dx (N, H) +=, dweight (N, k) =, expert weight grads +=.
  void backward(const Tensor& dout, const std::vector<ExpertWeights>& experts, const Tensor& dx,
                const Tensor& dweight);
  void release();

  // Tokens each expert received in the last forward (for load statistics).
  const std::vector<int64_t>& expert_counts() const { return counts_; }

 private:
  Backend& backend_;
  Stream& stream_;
  DType dtype_;
  int64_t tokens_ = 0, top_k_ = 0;
  std::vector<int64_t> counts_, offsets_;
  OwnedTensor row_token_, row_slot_, row_weight_;  // (M) permutation
  OwnedTensor x_rows_, a_, b_, y_rows_;            // (M, H), (M, F), (M, F), (M, H)
};

}  // namespace moepeak::schedules
