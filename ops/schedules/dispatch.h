// The expert-dispatch interface the model's MoE block calls (docs/design.md#the-schedules): route
// each token's normalised hidden state to its top-k experts, run their SwiGLU GEMMs, combine the
// weighted outputs, and in backward the reverse. Implementations:
//   StandardDispatch        one rank, all routed rows at once       (dispatch_standard.h)
//   ExpertParallelDispatch  W ranks, one all_to_all_v each way      (dispatch_expert_parallel.h)
//   LlepDispatch            W ranks, least-loaded placement of rows  (dispatch_llep.h)
//   PipelinedLlepDispatch   LLEP per chunk, buffers fixed at launch  (dispatch_pipelined_llep.h)
// The model picks one from schedules.dispatch (make_dispatch, dispatch_choice.h).
//
//   x       (N, H)   this rank's tokens
//   index   (N, k)   i32 top-k expert ids (global, in [0, E)), weight (N, k) their weights
//   experts          the experts this rank stores, in id order
//   out     (N, H)   += sum_j weight[n, j] * expert_{index[n, j]}(x[n])
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/tensor.h"

namespace moepeak::schedules {

// One expert's weights: w1, w3 (F, H), w2 (H, F), and their gradients (accumulated); with
// biases (gpt-oss), b1, b3 (F) and b2 (H) and their gradients db1, db3, db2 (accumulated):
//   y_e(x) = act(x w1^T + b1, x w3^T + b3) w2^T + b2
// act is the dispatcher's (ops::SwigluParams, given at its construction; the default is the plain
// SwiGLU). The biases are all three defined or none (undefined Tensor(): no biases, and every
// schedule computes exactly what it computed before biases existed); their gradients as the
// weights' (an expert's gradients all defined in backward; the forward may omit them). A bias
// has the weights' dtype, its gradient the weights' gradients' (main_grad_dtype).
struct ExpertWeights {
  Tensor w1, w2, w3;
  Tensor dw1, dw2, dw3;
  // NOTES: default member initializers, so `{w1, w2, w3, dw1, dw2, dw3}` still initializes
  // every member without -Wmissing-field-initializers.
  Tensor b1{}, b2{}, b3{};
  Tensor db1{}, db2{}, db3{};

  bool has_biases() const { return b1.defined(); }
};

// Throws unless every expert has all three biases or none, all alike, with (F), (H) and (F)
// shapes matching its weights (and gradients likewise where given). `who` names the dispatcher.
void check_expert_biases(const std::vector<ExpertWeights>& experts, const char* who);

class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  // Forward: out += MoE(x). Keeps what backward needs until backward() or release().
  // A dispatcher whose supports_plan_only() is true (PipelinedLlepDispatch) also takes an
  // undefined `out` (plan only, for a checkpoint recompute).
  virtual void forward(const Tensor& x, const Tensor& index, const Tensor& weight,
                       const std::vector<ExpertWeights>& experts, const Tensor& out) = 0;
  // Backward from dout (N, H): dx (N, H) +=, dweight (N, k) =, expert weight grads +=.
  virtual void backward(const Tensor& dout, const std::vector<ExpertWeights>& experts,
                        const Tensor& dx, const Tensor& dweight) = 0;
  virtual void release() = 0;
  // Whether forward() with an undefined `out` only plans what backward needs (a recompute whose
  // output is dropped then saves the dispatch and the expert GEMMs).
  virtual bool supports_plan_only() const { return false; }
  // Rows each expert received in the last forward, over the whole job (E entries; metrics and
  // the auxiliary load-balancing loss).
  virtual const std::vector<int64_t>& expert_counts() const = 0;
};

}  // namespace moepeak::schedules
