#include "core/model/param_layout.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/param_init.h"
#include "ops/fill.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak {
ParamLayout::ParamLayout(const ModelConfig& m)
    : spec_(describe_decoder(m)), family_(&family_of(m.model_type)) {
  const int64_t H = spec_.hidden, V = spec_.vocab;
  auto piece = [](Piece p, int64_t layer = -1, int64_t expert = -1) {
    return PieceRef{p, static_cast<int>(layer), static_cast<int>(expert)};
  };
  using K = Kind;
  embed = add(piece(Piece::embed), Shape{V, H}, K::matrix);
  for (int64_t i = 0; i < static_cast<int64_t>(spec_.layers.size()); ++i) {
    const AttentionSpec& a = spec_.layers[i].attention;
    const MlpSpec& mlp = spec_.layers[i].mlp;
    const int64_t d = a.head_dim, nh = a.heads, nkv = a.kv_heads, I = mlp.intermediate;
    LayerParamIndex L;
    L.input_norm = add(piece(Piece::input_norm, i), Shape{H}, K::norm);
    int64_t attn = 0;
    if (a.latent()) {
      const int64_t dv = a.value_dim(), rq = a.q_lora_rank, rkv = a.kv_lora_rank;
      const int64_t nope = d - a.rope_dim;
      if (rq > 0) {
        L.q_a = add(piece(Piece::q_a, i), Shape{rq, H}, K::matrix);
        L.q_a_norm = add(piece(Piece::q_a_norm, i), Shape{rq}, K::norm);
        L.q_b = add(piece(Piece::q_b, i), Shape{nh * d, rq}, K::matrix);
        attn += rq * H + nh * d * rq;
      } else {
        L.q = add(piece(Piece::q, i), Shape{nh * d, H}, K::matrix);
        attn += nh * d * H;
      }
      L.kv_a = add(piece(Piece::kv_a, i), Shape{rkv + a.rope_dim, H}, K::matrix);
      L.kv_a_norm = add(piece(Piece::kv_a_norm, i), Shape{rkv}, K::norm);
      L.kv_b = add(piece(Piece::kv_b, i), Shape{nh * (nope + dv), rkv}, K::matrix);
      L.o = add(piece(Piece::o, i), Shape{H, nh * dv}, K::matrix);
      attn += (rkv + a.rope_dim) * H + nh * (nope + dv) * rkv + H * nh * dv;
    } else {
      L.q = add(piece(Piece::q, i), Shape{nh * d, H}, K::matrix);
      L.k = add(piece(Piece::k, i), Shape{nkv * d, H}, K::matrix);
      L.v = add(piece(Piece::v, i), Shape{nkv * d, H}, K::matrix);
      L.o = add(piece(Piece::o, i), Shape{H, nh * d}, K::matrix);
      attn += (2 * nh * d + 2 * nkv * d) * H;
    }
    if (a.bias) {
      L.q_bias = add(piece(Piece::q_bias, i), Shape{nh * d}, K::vector);
      L.k_bias = add(piece(Piece::k_bias, i), Shape{nkv * d}, K::vector);
      L.v_bias = add(piece(Piece::v_bias, i), Shape{nkv * d}, K::vector);
      L.o_bias = add(piece(Piece::o_bias, i), Shape{H}, K::vector);
      attn += nh * d + 2 * nkv * d + H;
    }
    if (a.sinks) L.sinks = add(piece(Piece::sinks, i), Shape{nh}, K::vector);
    if (a.qk_norm) {
      L.q_norm = add(piece(Piece::q_norm, i), Shape{d}, K::norm);
      L.k_norm = add(piece(Piece::k_norm, i), Shape{d}, K::norm);
    }
    L.post_norm = add(piece(Piece::post_norm, i), Shape{H}, K::norm);
    if (mlp.moe()) {
      L.router = add(piece(Piece::router, i), Shape{mlp.experts, H}, K::matrix);
      if (mlp.router.bias)
        L.router_bias = add(piece(Piece::router_bias, i), Shape{mlp.experts}, K::vector);
      if (mlp.router.correction_bias) {
        L.router_correction_bias =
            add(piece(Piece::router_correction_bias, i), Shape{mlp.experts}, K::zeros);
      }
      for (int64_t j = 0; j < mlp.experts; ++j) {
        L.w1.push_back(add(piece(Piece::expert_gate, i, j), Shape{I, H}, K::matrix));
        L.w2.push_back(add(piece(Piece::expert_down, i, j), Shape{H, I}, K::matrix));
        L.w3.push_back(add(piece(Piece::expert_up, i, j), Shape{I, H}, K::matrix));
        if (mlp.bias) {
          L.b1.push_back(add(piece(Piece::expert_gate_bias, i, j), Shape{I}, K::vector));
          L.b2.push_back(add(piece(Piece::expert_down_bias, i, j), Shape{H}, K::vector));
          L.b3.push_back(add(piece(Piece::expert_up_bias, i, j), Shape{I}, K::vector));
        }
      }
      const int64_t Is = mlp.shared_intermediate;
      if (Is > 0) {
        L.shared_gate = add(piece(Piece::shared_gate, i), Shape{Is, H}, K::matrix);
        L.shared_up = add(piece(Piece::shared_up, i), Shape{Is, H}, K::matrix);
        L.shared_down = add(piece(Piece::shared_down, i), Shape{H, Is}, K::matrix);
      }
      const int64_t expert_biases = mlp.bias ? 2 * I + H : 0;
      active_ +=
          attn + mlp.experts * H + mlp.router.top_k * (3 * I * H + expert_biases) + 3 * Is * H;
    } else {
      L.dense_gate = add(piece(Piece::dense_gate, i), Shape{I, H}, K::matrix);
      L.dense_up = add(piece(Piece::dense_up, i), Shape{I, H}, K::matrix);
      L.dense_down = add(piece(Piece::dense_down, i), Shape{H, I}, K::matrix);
      active_ += attn + 3 * I * H;
    }
    layers.push_back(std::move(L));
  }
  final_norm = add(piece(Piece::final_norm), Shape{H}, K::norm);
  lm_head = spec_.tied_embeddings ? embed : add(piece(Piece::lm_head), Shape{V, H}, K::matrix);
  active_ += V * H;
  expert_index_.assign(params_.size(), -1);
  for (const LayerParamIndex& L : layers) {
    for (size_t j = 0; j < L.w1.size(); ++j) {
      expert_index_[L.w1[j]] = expert_index_[L.w2[j]] = expert_index_[L.w3[j]] =
          static_cast<int>(j);
    }
    for (size_t j = 0; j < L.b1.size(); ++j) {
      expert_index_[L.b1[j]] = expert_index_[L.b2[j]] = expert_index_[L.b3[j]] =
          static_cast<int>(j);
    }
  }
}

const ParamLayout& cached_param_layout(const ModelConfig& model) {
  thread_local std::unique_ptr<std::pair<ModelConfig, ParamLayout>> last;
  if (!last || !(last->first == model)) {
    last = std::make_unique<std::pair<ModelConfig, ParamLayout>>(model, ParamLayout(model));
  }
  return last->second;
}

int ParamLayout::add(PieceRef piece, Shape shape, Kind kind) {
  ParamInfo p;
  p.name = family_->tensor_name(piece);
  p.piece = piece;
  p.shape = shape;
  p.offset = total_;
  p.is_norm = kind == Kind::norm;
  p.zero_init = kind == Kind::zeros;
  p.decays = kind == Kind::matrix;
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
      double v = p.zero_init ? 0.0 : param_init::element(seed, i, p.is_norm, initializer_range, j);
      param_init::store(dtype_, v, host.data() + (p.offset + j) * dtype_size(dtype_));
    }
  }
  backend_.copy_async(values_.data(), host.data(), host.size(), CopyKind::host_to_device, stream);
  stream.synchronize();  // `host` dies here
}

void ParamStore::zero_grads(Stream& stream) { ops::fill(grads_, 0.0, stream); }

}  // namespace moepeak
