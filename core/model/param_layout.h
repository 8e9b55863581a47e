// The parameters of a Mixtral decoder: names and shapes as Hugging Face's MixtralForCausalLM,
// stored in one flat weights buffer and one flat grads buffer (device arena, live sets `weights`
// and `grads`) with each tensor a view at an aligned offset. Flat storage lets the optimizer walk
// parameters in buckets and the gradient norm run in one pass.
//
//   model.embed_tokens.weight                              (V, H)
//   model.layers.{i}.input_layernorm.weight                (H)
//   model.layers.{i}.self_attn.q_proj.weight               (nh*d, H)
//   model.layers.{i}.self_attn.{k,v}_proj.weight           (nkv*d, H)
//   model.layers.{i}.self_attn.o_proj.weight               (H, nh*d)
//   model.layers.{i}.post_attention_layernorm.weight       (H)
//   model.layers.{i}.block_sparse_moe.gate.weight          (E, H)
//   model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight (F, H)   gate projection
//   model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight (F, H)   up projection
//   model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight (H, F)   down projection
//   model.norm.weight                                      (H)
//   lm_head.weight                                         (V, H)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

namespace moepeak {

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;    // elements from the start of the flat buffers
  bool is_norm = false;  // RMSNorm weights: initialised to 1, no weight decay
};

struct LayerParamIndex {
  int input_norm, q, k, v, o, post_norm, gate;
  std::vector<int> w1, w2, w3;  // per expert
};

// Parameter layout of a model config; no memory. Offsets are aligned to kAlignElements.
class ParamLayout {
 public:
  static constexpr int64_t kAlignElements = 64;
  explicit ParamLayout(const ModelConfig& model);

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total_elements() const { return total_; }   // including alignment padding
  int64_t parameter_count() const { return count_; }  // Θ: real parameters
  // Parameters a token's forward pass multiplies with (top-k experts only; no embedding).
  int64_t active_matmul_parameters() const { return active_; }
  int embed, final_norm, lm_head;
  std::vector<LayerParamIndex> layers;
  int find(const std::string& name) const;  // -1 if absent

 private:
  int add(std::string name, Shape shape, bool is_norm);
  std::vector<ParamInfo> params_;
  int64_t total_ = 0, count_ = 0, active_ = 0;
};

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
