// The family registry and what the families share: the Llama-style tensor names of the embedding,
// norms and attention, the Hub placement of a param that is a tensor of its own, and the
// DecoderSpec queries (see family.h, decoder_spec.h).
#include "core/model/families/family.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace moepeak {

std::span<const Family* const> all_families() {
  static const std::array<const Family*, 4> families = {&mixtral_family(), &qwen3_moe_family(),
                                                        &gpt_oss_family(), &deepseek_v3_family()};
  return families;
}

const Family& family_of(ModelType type) {
  for (const Family* f : all_families()) {
    if (f->type == type) return *f;
  }
  MOEPEAK_THROW("no family for model_type ", enum_name(type));
}

const Family& family_named(std::string_view model_type, const std::string& source) {
  std::string known;
  for (const Family* f : all_families()) {
    if (f->model_type == model_type) return *f;
    for (std::string_view alias : f->model_type_aliases) {
      if (alias == model_type) return *f;
    }
    known += (known.empty() ? "\"" : ", \"") + std::string(f->model_type) + "\"";
  }
  MOEPEAK_INPUT_ERROR(source, ": field \"model_type\" is \"", model_type,
                      "\"; moepeak trains the families ", known, " (docs/models.md)");
}

DecoderSpec describe_decoder(const ModelConfig& model) {
  return family_of(model.model_type).describe(model);
}

std::string llama_tensor_name(const PieceRef& r) {
  const std::string layer = "model.layers." + std::to_string(r.layer) + ".";
  switch (r.piece) {
    case Piece::embed:
      return "model.embed_tokens.weight";
    case Piece::final_norm:
      return "model.norm.weight";
    case Piece::lm_head:
      return "lm_head.weight";
    case Piece::input_norm:
      return layer + "input_layernorm.weight";
    case Piece::post_norm:
      return layer + "post_attention_layernorm.weight";
    case Piece::q:
      return layer + "self_attn.q_proj.weight";
    case Piece::k:
      return layer + "self_attn.k_proj.weight";
    case Piece::v:
      return layer + "self_attn.v_proj.weight";
    case Piece::o:
      return layer + "self_attn.o_proj.weight";
    case Piece::q_bias:
      return layer + "self_attn.q_proj.bias";
    case Piece::k_bias:
      return layer + "self_attn.k_proj.bias";
    case Piece::v_bias:
      return layer + "self_attn.v_proj.bias";
    case Piece::o_bias:
      return layer + "self_attn.o_proj.bias";
    case Piece::sinks:
      return layer + "self_attn.sinks";
    case Piece::q_norm:
      return layer + "self_attn.q_norm.weight";
    case Piece::k_norm:
      return layer + "self_attn.k_norm.weight";
    case Piece::dense_gate:
      return layer + "mlp.gate_proj.weight";
    case Piece::dense_up:
      return layer + "mlp.up_proj.weight";
    case Piece::dense_down:
      return layer + "mlp.down_proj.weight";
    case Piece::q_a:
    case Piece::q_a_norm:
    case Piece::q_b:
    case Piece::kv_a:
    case Piece::kv_a_norm:
    case Piece::kv_b:
    case Piece::router_correction_bias:
    case Piece::shared_gate:
    case Piece::shared_up:
    case Piece::shared_down:
    case Piece::router:
    case Piece::router_bias:
    case Piece::expert_gate:
    case Piece::expert_up:
    case Piece::expert_down:
    case Piece::expert_gate_bias:
    case Piece::expert_up_bias:
    case Piece::expert_down_bias:
      break;
  }
  MOEPEAK_THROW(
      "llama_tensor_name: a router's, an expert's or a latent attention's name is its "
      "family's");
}

HubPlacement whole_hub_tensor(std::string tensor, const std::vector<int64_t>& dims) {
  HubPlacement p;
  p.tensor = std::move(tensor);
  p.shape = dims;
  p.strides.assign(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;) p.strides[k - 1] = p.strides[k] * dims[k];
  return p;
}

namespace {

// The [model] rope_* fields as the op's scaling (0 = not set, see ModelConfig).
ops::RopeScaling rope_scaling_of(const ModelConfig& m) {
  ops::RopeScaling r;
  switch (m.rope_type) {
    case RopeType::default_rope:
      return r;
    case RopeType::linear:
      r.type = ops::RopeType::linear;
      break;
    case RopeType::dynamic:
      r.type = ops::RopeType::dynamic;
      break;
    case RopeType::yarn:
      r.type = ops::RopeType::yarn;
      break;
    case RopeType::llama3:
      r.type = ops::RopeType::llama3;
      break;
  }
  r.factor = m.rope_factor;
  if (m.rope_original_max_position_embeddings > 0)
    r.original_max_position_embeddings = m.rope_original_max_position_embeddings;
  if (r.type == ops::RopeType::yarn) {
    r.beta_fast = m.rope_beta_fast;
    r.beta_slow = m.rope_beta_slow;
    r.truncate = m.rope_truncate;
    if (m.rope_mscale > 0) r.mscale = m.rope_mscale;
    if (m.rope_mscale_all_dim > 0) r.mscale_all_dim = m.rope_mscale_all_dim;
    if (m.rope_attention_factor > 0) r.attention_factor = m.rope_attention_factor;
  }
  if (r.type == ops::RopeType::llama3) {
    r.low_freq_factor = m.rope_low_freq_factor;
    r.high_freq_factor = m.rope_high_freq_factor;
  }
  return r;
}

}  // namespace

ops::RopeParams RopeSpec::params(int64_t seq_len) const {
  return ops::rope_params(scaling, theta, rotary_dim, max_position_embeddings, seq_len,
                          interleaved);
}

DecoderSpec shared_decoder_spec(const ModelConfig& m) {
  DecoderSpec s;
  s.family = m.model_type;
  s.vocab = m.vocab_size;
  s.hidden = m.hidden_size;
  s.norm_eps = m.rms_norm_eps;
  s.rope.scaling = rope_scaling_of(m);
  s.rope.theta = m.rope_theta;
  s.rope.rotary_dim = m.head_dim_resolved();
  s.rope.max_position_embeddings = m.max_position_embeddings;
  // The scaling's parameters are checked here, before any run: the op's message names the field.
  try {
    s.rope.params(m.max_position_embeddings);
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR("model.rope_type = \"", enum_name(m.rope_type),
                        "\" (its model.rope_* keys, ",
                        "or config.json's rope_scaling): ", nested_message(e));
  }
  s.tied_embeddings = m.tie_word_embeddings;
  s.aux_loss_coef = m.router_aux_loss_coef;
  LayerSpec layer;
  layer.attention.heads = m.num_attention_heads;
  layer.attention.kv_heads = m.num_key_value_heads;
  layer.attention.head_dim = m.head_dim_resolved();
  layer.attention.scale = 1.0 / std::sqrt(static_cast<double>(m.head_dim_resolved()));
  s.layers.assign(static_cast<size_t>(m.num_hidden_layers), layer);
  return s;
}

void unsupported_setting(const ModelConfig& m, std::string_view key, std::string_view why) {
  MOEPEAK_INPUT_ERROR("model.", key, " is set, but the ", enum_name(m.model_type), " family ", why,
                      " (docs/models.md)");
}

void require_full_attention_and_swiglu(const ModelConfig& m) {
  const ModelConfig defaults;
  if (!m.layer_types.empty())
    unsupported_setting(m, "layer_types", "attends to every earlier key in every layer");
  if (m.sliding_window != 0)
    unsupported_setting(m, "sliding_window", "has no sliding-window attention in moepeak");
  if (m.swiglu_limit != defaults.swiglu_limit)
    unsupported_setting(m, "swiglu_limit", "has plain SwiGLU experts");
  if (m.swiglu_alpha != defaults.swiglu_alpha)
    unsupported_setting(m, "swiglu_alpha", "has plain SwiGLU experts");
}

void require_experts_in_every_layer(const ModelConfig& m) {
  if (m.moe_intermediate_size != 0 && m.moe_intermediate_size != m.intermediate_size)
    unsupported_setting(m, "moe_intermediate_size", "sizes its experts by intermediate_size");
  if (!m.mlp_only_layers.empty())
    unsupported_setting(m, "mlp_only_layers", "has experts in every layer");
  if (m.decoder_sparse_step != 1)
    unsupported_setting(m, "decoder_sparse_step", "has experts in every layer");
}

void require_no_deepseek_fields(const ModelConfig& m) {
  const ModelConfig d;
  const std::string_view why = "has none (it is deepseek_v3's)";
  if (m.q_lora_rank != d.q_lora_rank) unsupported_setting(m, "q_lora_rank", why);
  if (m.kv_lora_rank != d.kv_lora_rank) unsupported_setting(m, "kv_lora_rank", why);
  if (m.qk_nope_head_dim != d.qk_nope_head_dim) unsupported_setting(m, "qk_nope_head_dim", why);
  if (m.qk_rope_head_dim != d.qk_rope_head_dim) unsupported_setting(m, "qk_rope_head_dim", why);
  if (m.v_head_dim != d.v_head_dim) unsupported_setting(m, "v_head_dim", why);
  if (m.n_group != d.n_group) unsupported_setting(m, "n_group", why);
  if (m.topk_group != d.topk_group) unsupported_setting(m, "topk_group", why);
  if (m.routed_scaling_factor != d.routed_scaling_factor)
    unsupported_setting(m, "routed_scaling_factor", why);
  if (m.n_shared_experts != d.n_shared_experts) unsupported_setting(m, "n_shared_experts", why);
  if (m.first_k_dense_replace != d.first_k_dense_replace)
    unsupported_setting(m, "first_k_dense_replace", why);
  if (m.router_bias_update_rate != d.router_bias_update_rate)
    unsupported_setting(m, "router_bias_update_rate", why);
  if (m.num_nextn_predict_layers != d.num_nextn_predict_layers)
    unsupported_setting(m, "num_nextn_predict_layers", why);
  if (m.rope_interleave != d.rope_interleave)
    unsupported_setting(m, "rope_interleave", "rotates the (i, i + d/2) pairs of its heads");
}

int64_t DecoderSpec::moe_layers() const {
  return std::count_if(layers.begin(), layers.end(),
                       [](const LayerSpec& l) { return l.mlp.moe(); });
}

int64_t DecoderSpec::experts() const {
  for (const LayerSpec& l : layers) {
    if (l.mlp.moe()) return l.mlp.experts;
  }
  return 0;
}

int64_t DecoderSpec::top_k() const {
  for (const LayerSpec& l : layers) {
    if (l.mlp.moe()) return l.mlp.router.top_k;
  }
  return 0;
}

bool DecoderSpec::any_dense() const { return moe_layers() < static_cast<int64_t>(layers.size()); }

bool DecoderSpec::any_attention_bias() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.attention.bias; });
}

bool DecoderSpec::any_sinks() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.attention.sinks; });
}

bool DecoderSpec::any_latent() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.attention.latent(); });
}

bool DecoderSpec::any_shared_experts() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.mlp.shared_intermediate > 0; });
}

bool DecoderSpec::any_qk_norm() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.attention.qk_norm; });
}

}  // namespace moepeak
