// The Mixtral decoder (DESIGN.md §5) on one rank: forward and backward of a batch with the
// standard schedule of each live set — materialised logits, all-at-once expert dispatch, and
// per-layer gradient checkpointing ("none": every activation kept; "standard": only each layer's
// input kept, the layer recomputed in backward).
//
//   input_ids, labels, positions (N) i64 with N = B*T tokens, sequence-major
//   embedding -> L x [x += attn(norm(x)); x += moe(norm(x))] -> norm -> lm_head -> cross-entropy
//
// Live sets: weights and grads (ParamStore), attention (norm, q, k, v, attention output, lse),
// dispatch (StandardDispatch), logits (MaterializedVocab), boundaries (each layer's output, the
// next layer's input), workspace (everything else).
#pragma once

#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/model/mixtral_params.h"
#include "core/runtime/backend.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/vocab_materialized.h"

namespace moepeak {

struct TokenBatch {
  Tensor input_ids;  // (N) i64, device
  Tensor labels;     // (N) i64, device; -100 = not scored
  Tensor positions;  // (N) i64, device; global positions in each sequence
  int64_t batch = 0, seq_len = 0;
  int64_t scored_tokens = 0;  // labels != -100 (the loss is their mean)
};

class MixtralModel {
 public:
  // dtype: f32 (training on the CPU) or f64 (gradient checks).
  MixtralModel(Backend& backend, Stream& stream, const ModelConfig& model,
               CheckpointSchedule checkpoint, DType dtype);
  ~MixtralModel();

  ParamStore& params() { return params_; }
  const ModelConfig& config() const { return model_; }

  // Mean cross-entropy over the scored tokens (plus router_aux_loss_coef times Mixtral's
  // load-balancing loss when the coefficient is not 0, as HF's MixtralForCausalLM reports it),
  // and its gradients accumulated (+=) into
  // params().flat_grads(). loss_tokens: the number of scored tokens the mean is over (the global
  // count when the batch is one rank's share).
  double forward_backward(const TokenBatch& batch, int64_t loss_tokens);
  // The same loss without gradients (evaluation, finite differences).
  double forward_loss(const TokenBatch& batch, int64_t loss_tokens);

  // Tokens routed to each expert of each layer in the last forward: [layer][expert].
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }

 private:
  struct LayerActivations;
  OwnedTensor layer_forward(int layer, const Tensor& x, const TokenBatch& batch,
                            LayerActivations& acts, bool recompute);
  OwnedTensor layer_backward(int layer, const Tensor& dy, const Tensor& x, const TokenBatch& batch,
                             LayerActivations& acts);
  double run(const TokenBatch& batch, int64_t loss_tokens, bool with_backward);
  std::vector<schedules::ExpertWeights> experts_of(int layer) const;
  // Mixtral's auxiliary load-balancing loss (router_aux_loss_coef > 0), HF's formula over all
  // layers: adds each layer's column sums of the router probabilities, then forms the loss and
  // (for backward) its constant per-expert gradient with respect to the probabilities.
  void accumulate_router_prob_sums(const Tensor& probs);
  double router_aux_loss(int64_t tokens, bool with_backward);
  OwnedTensor device(Shape shape, LiveSet set, const char* what) const;

  Backend& backend_;
  Stream& stream_;
  ModelConfig model_;
  CheckpointSchedule checkpoint_;
  DType dtype_;
  ParamStore params_;
  std::vector<std::vector<int64_t>> expert_load_;
  std::vector<double> router_prob_sums_;  // per expert, over all layers of the current forward
  OwnedTensor aux_dprobs_;                // (E) d(coef * aux)/d probs, during backward
};

}  // namespace moepeak
