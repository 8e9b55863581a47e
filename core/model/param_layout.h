// The parameters of a decoder: one tensor per piece of its description (DecoderSpec), named as
// the family's Hugging Face checkpoints name it (Family::tensor_name; where the Hub fuses pieces,
// as gpt-oss's experts, a name per piece, and core/model/hub_layout.h places it in the fused
// tensor), stored in one flat weights buffer and one flat grads buffer (device arena, live sets
// `weights` and `grads`) with each tensor a view at an aligned offset. Flat storage lets the
// optimizer walk parameters in buckets and the gradient norm run in one pass. In order (the order
// initialisation keys its streams by):
//
//   embed                                   (V, H)
//   per layer l:
//     input_norm                            (H)
//     grouped-query attention:
//       q, k, v, o                          (nh d, H), (nkv d, H) x2, (H, nh d)
//       q, k, v, o biases   with bias       (nh d), (nkv d) x2, (H)
//       sinks               with sinks      (nh)
//       q_norm, k_norm      with qk_norm    (d) each
//     latent attention (d = nope + rope, dv the value heads' width):
//       q_a, q_a_norm, q_b                  (r_q, H), (r_q), (nh d, r_q); or q (nh d, H), r_q = 0
//       kv_a, kv_a_norm, kv_b               (r_kv + rope, H), (r_kv), (nh (nope + dv), r_kv)
//       o                                   (H, nh dv)
//     post_norm                             (H)
//     MoE: router (E, H), its bias (E) with router.bias, its correction bias (E, zeros, never
//          given a gradient) with router.correction_bias, then per expert e: gate (w1) (I, H),
//          down (w2) (H, I), up (w3) (I, H), and with the MLP's bias their biases b1 (I), b2 (H),
//          b3 (I); then with shared_intermediate Is > 0 the shared experts' gate, up, down
//          (Is, H), (Is, H), (H, Is)
//     dense: gate, up, down                 (I, H), (I, H), (H, I)
//   final_norm                              (H)
//   lm_head                                 (V, H); none when tied (lm_head == embed)
//
// Mixtral's names: model.embed_tokens.weight, model.layers.{l}.self_attn.q_proj.weight, ...,
// model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight, model.norm.weight, lm_head.weight
// (core/model/families/mixtral.cpp; the other families beside it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/decoder_spec.h"
#include "core/model/families/family.h"  // defines: PieceRef, Family
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

namespace moepeak {

struct ParamInfo {
  std::string name;  // Family::tensor_name(piece)
  PieceRef piece;    // what it is (its Hub placement: Family::hub_placement, hub_layout.h)
  Shape shape;
  int64_t offset = 0;      // elements from the start of the flat buffers
  bool is_norm = false;    // RMSNorm weights: initialised to 1
  bool zero_init = false;  // initialised to 0 (the router's correction bias)
  bool decays = false;     // AdamW's weight decay applies: matrices only (not norms, biases, sinks)
};

struct LayerParamIndex {
  int input_norm = -1, q = -1, k = -1, v = -1, o = -1, post_norm = -1;
  int q_norm = -1, k_norm = -1;                            // with AttentionSpec::qk_norm
  int q_bias = -1, k_bias = -1, v_bias = -1, o_bias = -1;  // with AttentionSpec::bias
  int sinks = -1;                                          // with AttentionSpec::sinks
  int router = -1;                                         // MoE layers
  int router_bias = -1;                                    // with RouterSpec::bias
  int router_correction_bias = -1;                         // with RouterSpec::correction_bias
  // Latent attention (q = -1 with q_lora_rank > 0; k = v = -1 always).
  int q_a = -1, q_a_norm = -1, q_b = -1, kv_a = -1, kv_a_norm = -1, kv_b = -1;
  int shared_gate = -1, shared_up = -1, shared_down = -1;  // with MlpSpec::shared_intermediate
  std::vector<int> w1, w2, w3;  // MoE layers, per expert: gate, down, up (ExpertWeights' names)
  std::vector<int> b1, b2, b3;  // their biases, with MlpSpec::bias (else empty)
  int dense_gate = -1, dense_up = -1, dense_down = -1;  // dense layers
  bool moe() const { return router >= 0; }
};

// Parameter layout of a model config; no memory. Offsets are aligned to kAlignElements.
class ParamLayout {
 public:
  static constexpr int64_t kAlignElements = 64;
  // The layout of describe_decoder(model), named by model.model_type's family.
  explicit ParamLayout(const ModelConfig& model);

  const DecoderSpec& spec() const { return spec_; }
  // The LM head is the embedding (tie_word_embeddings): lm_head == embed.
  bool tied() const { return lm_head == embed; }

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total_elements() const { return total_; }   // including alignment padding
  int64_t parameter_count() const { return count_; }  // Θ: real parameters
  // Parameters a token's forward pass multiplies with (top-k experts only; no embedding).
  int64_t active_matmul_parameters() const { return active_; }
  int embed = -1, final_norm = -1, lm_head = -1;
  std::vector<LayerParamIndex> layers;
  int find(const std::string& name) const;  // -1 if absent
  // Per param, the expert it belongs to (j of w1[j], w2[j], w3[j], b1[j], b2[j], b3[j]), or -1.
  const std::vector<int>& expert_index() const { return expert_index_; }

 private:
  // vector: a bias or the sinks (no decay, random); zeros: the correction bias (no decay, 0).
  enum class Kind { matrix, norm, vector, zeros };
  int add(PieceRef piece, Shape shape, Kind kind);
  DecoderSpec spec_;
  const Family* family_;
  std::vector<ParamInfo> params_;
  std::vector<int> expert_index_;
  int64_t total_ = 0, count_ = 0, active_ = 0;
};

// The layout of `model`, kept for the last config this thread asked about: the planner builds many
// plans of one model (the layout search, the max-context bisection), and a layout of 10^4 named
// tensors (Qwen3-30B-A3B: 18,000 experts' matrices) costs milliseconds each time.
const ParamLayout& cached_param_layout(const ModelConfig& model);

class ParamStore {
 public:
  ParamStore(Backend& backend, const ModelConfig& model, DType dtype);

  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  // The gradients' dtype: schedules::main_grad_dtype(dtype()) (fp32 for bf16 weights).
  DType grad_dtype() const { return grad_dtype_; }
  Tensor value(int index) const;
  Tensor grad(int index) const;
  Tensor flat_values() const { return values_.view(); }
  Tensor flat_grads() const { return grads_.view(); }

  // Normal(0, initializer_range) for matrices, ones for norms; each tensor from its own
  // counter-based stream keyed by (seed, tensor index), so values do not depend on order.
  void initialize(uint64_t seed, double initializer_range, Stream& stream);
  void zero_grads(Stream& stream);

 private:
  ParamLayout layout_;
  DType dtype_, grad_dtype_;
  Backend& backend_;
  OwnedTensor values_, grads_;
};

}  // namespace moepeak
