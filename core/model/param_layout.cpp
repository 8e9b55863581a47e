#include "core/model/param_layout.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/model/param_init.h"
#include "ops/fill.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak {
ParamLayout::ParamLayout(const ModelConfig& m) {
  const int64_t H = m.hidden_size, V = m.vocab_size, F = m.intermediate_size;
  const int64_t d = m.head_dim_resolved(), nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const int64_t E = m.num_local_experts;
  embed = add("model.embed_tokens.weight", Shape{V, H}, false);
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerParamIndex L{};
    L.input_norm = add(p + "input_layernorm.weight", Shape{H}, true);
    L.q = add(p + "self_attn.q_proj.weight", Shape{nh * d, H}, false);
    L.k = add(p + "self_attn.k_proj.weight", Shape{nkv * d, H}, false);
    L.v = add(p + "self_attn.v_proj.weight", Shape{nkv * d, H}, false);
    L.o = add(p + "self_attn.o_proj.weight", Shape{H, nh * d}, false);
    L.post_norm = add(p + "post_attention_layernorm.weight", Shape{H}, true);
    L.gate = add(p + "block_sparse_moe.gate.weight", Shape{E, H}, false);
    for (int64_t j = 0; j < E; ++j) {
      std::string e = p + "block_sparse_moe.experts." + std::to_string(j) + ".";
      L.w1.push_back(add(e + "w1.weight", Shape{F, H}, false));
      L.w2.push_back(add(e + "w2.weight", Shape{H, F}, false));
      L.w3.push_back(add(e + "w3.weight", Shape{F, H}, false));
    }
    layers.push_back(std::move(L));
  }
  final_norm = add("model.norm.weight", Shape{H}, true);
  lm_head = add("lm_head.weight", Shape{V, H}, false);
  int64_t attn = (2 * nh * d + 2 * nkv * d) * H;
  int64_t moe = E * H + m.num_experts_per_tok * 3 * F * H;
  active_ = m.num_hidden_layers * (attn + moe) + V * H;
}

int ParamLayout::add(std::string name, Shape shape, bool is_norm) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = shape;
  p.offset = total_;
  p.is_norm = is_norm;
  count_ += shape.numel();
  total_ += (shape.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

ParamStore::ParamStore(Backend& backend, const ModelConfig& model, DType dtype)
    : layout_(model),
      dtype_(dtype),
      grad_dtype_(schedules::main_grad_dtype(dtype)),
      backend_(backend) {
  values_ = OwnedTensor::device(backend, Shape{layout_.total_elements()}, dtype, LiveSet::weights,
                                "model weights");
  grads_ = OwnedTensor::device(backend, Shape{layout_.total_elements()}, grad_dtype_,
                               LiveSet::grads, "model gradients");
}

Tensor ParamStore::value(int index) const {
  const ParamInfo& p = layout_.params()[index];
  char* base = static_cast<char*>(values_.data()) + p.offset * dtype_size(dtype_);
  return Tensor(base, p.shape, dtype_, Placement::device, &backend_);
}

Tensor ParamStore::grad(int index) const {
  const ParamInfo& p = layout_.params()[index];
  char* base = static_cast<char*>(grads_.data()) + p.offset * dtype_size(grad_dtype_);
  return Tensor(base, p.shape, grad_dtype_, Placement::device, &backend_);
}

void ParamStore::initialize(uint64_t seed, double initializer_range, Stream& stream) {
  // Generated on the host in float64, converted to the parameter dtype and copied in.
  std::vector<char> host(static_cast<size_t>(layout_.total_elements()) * dtype_size(dtype_), 0);
  const auto& params = layout_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    for (int64_t j = 0; j < p.shape.numel(); ++j) {
      double v = param_init::element(seed, i, p.is_norm, initializer_range, j);
      param_init::store(dtype_, v, host.data() + (p.offset + j) * dtype_size(dtype_));
    }
  }
  backend_.copy_async(values_.data(), host.data(), host.size(), CopyKind::host_to_device, stream);
  stream.synchronize();  // `host` dies here
}

void ParamStore::zero_grads(Stream& stream) { ops::fill(grads_, 0.0, stream); }

}  // namespace moepeak
