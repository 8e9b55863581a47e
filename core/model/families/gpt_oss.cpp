// The gpt-oss family (model_type "gpt_oss", transformers' GptOssForCausalLM): grouped-query
// attention with biases on q/k/v/o and a learned sink logit per head, even layers attending to a
// sliding window of the last sliding_window keys and odd layers to every key (layer_types); every
// layer MoE — a router with a bias whose top-k logits are softmaxed over the k, and experts with
// biases and a clamped SwiGLU, (clamp(up, ±limit) + 1) · g · σ(alpha · g) with g = min(gate,
// limit). RMSNorm multiplies its weight in fp32 before the cast, which is ops/rmsnorm.h's order.
// Tensor names (the attention's and the norms' are Llama's, family.cpp):
//   model.layers.{l}.self_attn.{q,k,v,o}_proj.bias                (nh d), (nkv d) x2, (H)
//   model.layers.{l}.self_attn.sinks                              (nh)
//   model.layers.{l}.mlp.router.{weight,bias}                     (E, H), (E)
// The Hub keeps a layer's experts fused — mlp.experts.gate_up_proj (E, H, 2I) with gate and up in
// alternate columns, gate_up_proj_bias (E, 2I), down_proj (E, I, H), down_proj_bias (E, H) — while
// moepeak keeps each expert's gate, up and down (and biases) as its own tensors, named
//   model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}
// inside moepeak's checkpoints; hub_placement says where each lies in the fused tensors (family.h,
// HubPlacement), and the Hugging Face import, export and step dump convert between the two. The
// released checkpoints hold gate_up_proj and down_proj as MXFP4 (their _blocks and _scales).
#include <algorithm>

#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/families/hf_fields.h"

namespace moepeak {
namespace {

// transformers' default when layer_types is not given: even layers sliding, odd full.
// GptOssConfig's sliding_window, taken when model.sliding_window is 0.
constexpr int64_t kDefaultSlidingWindow = 128;

int64_t sliding_window_of(const ModelConfig& m) {
  return m.sliding_window > 0 ? m.sliding_window : kDefaultSlidingWindow;
}

std::vector<AttentionLayerType> layer_types_of(const ModelConfig& m) {
  if (!m.layer_types.empty()) return m.layer_types;
  std::vector<AttentionLayerType> types;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    types.push_back(i % 2 == 0 ? AttentionLayerType::sliding_attention
                               : AttentionLayerType::full_attention);
  }
  return types;
}

DecoderSpec describe(const ModelConfig& m) {
  require_experts_in_every_layer(m);
  require_no_deepseek_fields(m);
  if (!m.norm_topk_prob)
    unsupported_setting(m, "norm_topk_prob", "always softmaxes over the chosen experts' logits");
  DecoderSpec s = shared_decoder_spec(m);
  s.norm_order = ops::NormWeightOrder::weight_in_compute_type;
  const std::vector<AttentionLayerType> types = layer_types_of(m);
  for (size_t i = 0; i < s.layers.size(); ++i) {
    LayerSpec& l = s.layers[i];
    l.attention.bias = m.attention_bias;
    l.attention.sinks = true;
    l.attention.window =
        types[i] == AttentionLayerType::sliding_attention ? sliding_window_of(m) : 0;
    l.mlp.kind = MlpKind::moe;
    l.mlp.intermediate = m.intermediate_size;
    l.mlp.experts = m.num_local_experts;
    l.mlp.router = RouterSpec{RouterScore::topk_then_softmax, m.num_experts_per_tok, true, true};
    l.mlp.activation = ExpertActivation::clamped_swiglu;
    l.mlp.swiglu_limit = m.swiglu_limit;
    l.mlp.swiglu_alpha = m.swiglu_alpha;
    l.mlp.bias = true;
  }
  return s;
}

std::string tensor_name(const PieceRef& r) {
  const std::string mlp = "model.layers." + std::to_string(r.layer) + ".mlp.";
  const std::string expert = mlp + "experts." + std::to_string(r.expert) + ".";
  switch (r.piece) {
    case Piece::router:
      return mlp + "router.weight";
    case Piece::router_bias:
      return mlp + "router.bias";
    case Piece::expert_gate:
      return expert + "gate_proj.weight";
    case Piece::expert_up:
      return expert + "up_proj.weight";
    case Piece::expert_down:
      return expert + "down_proj.weight";
    case Piece::expert_gate_bias:
      return expert + "gate_proj.bias";
    case Piece::expert_up_bias:
      return expert + "up_proj.bias";
    case Piece::expert_down_bias:
      return expert + "down_proj.bias";
    default:
      return llama_tensor_name(r);
  }
}

// The fused experts (family.h, HubPlacement); every other piece is a Hub tensor of its own.
HubPlacement hub_placement(const DecoderSpec& spec, const PieceRef& r,
                           const std::vector<int64_t>& dims) {
  const std::string experts = "model.layers." + std::to_string(r.layer) + ".mlp.experts.";
  const auto expert_count = [&] {
    return spec.layers.at(static_cast<size_t>(r.layer)).mlp.experts;
  };
  const bool up = r.piece == Piece::expert_up || r.piece == Piece::expert_up_bias;
  switch (r.piece) {
    case Piece::expert_gate:
    case Piece::expert_up: {  // (I, H): gate_up_proj[e, h, 2i (+1 for up)]
      const int64_t I = dims.at(0), H = dims.at(1);
      return {experts + "gate_up_proj",
              {expert_count(), H, 2 * I},
              r.expert * H * 2 * I + up,
              {2, 2 * I},
              true};
    }
    case Piece::expert_down: {  // (H, I): down_proj[e, i, h]
      const int64_t H = dims.at(0), I = dims.at(1);
      return {experts + "down_proj", {expert_count(), I, H}, r.expert * I * H, {1, H}, true};
    }
    case Piece::expert_gate_bias:
    case Piece::expert_up_bias: {  // (I): gate_up_proj_bias[e, 2i (+1 for up)]
      const int64_t I = dims.at(0);
      return {experts + "gate_up_proj_bias",
              {expert_count(), 2 * I},
              r.expert * 2 * I + up,
              {2},
              false};
    }
    case Piece::expert_down_bias: {  // (H): down_proj_bias[e, h]
      const int64_t H = dims.at(0);
      return {experts + "down_proj_bias", {expert_count(), H}, r.expert * H, {1}, false};
    }
    default:
      return whole_hub_tensor(tensor_name(r), dims);
  }
}

// OpenAI's config.json of gpt-oss-20b and -120b: the attention, the router, the embedding and
// the head stay bf16; only the experts' gate_up_proj and down_proj are MXFP4.
constexpr std::string_view kMxfp4ModulesToNotConvert[] = {
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"};

nlohmann::json to_hf_config(const ModelConfig& m, std::string_view dtype) {
  nlohmann::json j;
  hf_fields::write_shared(m, "GptOssForCausalLM", "gpt_oss", dtype, j);
  j["num_local_experts"] = m.num_local_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["experts_per_token"] = m.num_experts_per_tok;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.router_aux_loss_coef > 0;
  j["attention_bias"] = m.attention_bias;
  nlohmann::json types = nlohmann::json::array();
  for (AttentionLayerType t : layer_types_of(m)) types.push_back(enum_name(t));
  j["layer_types"] = types;
  j["sliding_window"] = sliding_window_of(m);
  j["swiglu_limit"] = m.swiglu_limit;
  j["swiglu_alpha"] = m.swiglu_alpha;
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& json, const std::string& source) {
  ModelConfig m;
  m.model_type = ModelType::gpt_oss;
  hf_fields::read_shared(json, source, m);
  m.num_local_experts = hf_fields::required_integer(json, source, "num_local_experts");
  // NOTES: OpenAI's config.json carries both names; transformers reads num_experts_per_tok.
  m.num_experts_per_tok = hf_fields::optional(json, "num_experts_per_tok")
                              ? hf_fields::required_integer(json, source, "num_experts_per_tok")
                              : hf_fields::required_integer(json, source, "experts_per_token");
  m.router_aux_loss_coef = hf_fields::read_aux_loss_coef(json, source);
  // transformers' defaults where a field is absent (GptOssConfig).
  m.attention_bias = hf_fields::boolean_or(json, source, "attention_bias", true);
  // NOTES: null is refused as transformers refuses it (its sliding mask needs a window even
  // where no layer slides); absent is GptOssConfig's default.
  const nlohmann::json* window = hf_fields::optional(json, "sliding_window");
  if (json.contains("sliding_window") && !window) {
    MOEPEAK_INPUT_ERROR(source, ": field \"sliding_window\" is null; gpt_oss needs a window ",
                        "(transformers' default is ", kDefaultSlidingWindow, ")");
  }
  m.sliding_window = hf_fields::integer_or(json, source, "sliding_window", kDefaultSlidingWindow);
  if (m.sliding_window < 1) {
    MOEPEAK_INPUT_ERROR(source, ": field \"sliding_window\" is ", m.sliding_window,
                        "; it must be at least 1");
  }
  m.swiglu_limit = hf_fields::number_or(json, source, "swiglu_limit", 7.0);
  m.swiglu_alpha = hf_fields::number_or(json, source, "swiglu_alpha", 1.702);
  if (const nlohmann::json* types = hf_fields::optional(json, "layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != m.num_hidden_layers) {
      MOEPEAK_INPUT_ERROR(source, ": field \"layer_types\" must list num_hidden_layers ",
                          m.num_hidden_layers, " layer types, got ", hf_fields::describe(*types));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const nlohmann::json& t = (*types)[i];
      const auto type =
          t.is_string() ? enum_from_name<AttentionLayerType>(t.get<std::string>()) : std::nullopt;
      if (!type) {
        MOEPEAK_INPUT_ERROR(source, ": field \"layer_types\"[", i, "] is ", t.dump(),
                            "; expected \"full_attention\" or \"sliding_attention\"");
      }
      m.layer_types.push_back(*type);
    }
  }
  return m;
}

}  // namespace

const Family& gpt_oss_family() {
  static const Family family{ModelType::gpt_oss, "gpt_oss",     "GptOssForCausalLM",
                             describe,           tensor_name,   to_hf_config,
                             from_hf_config,     hub_placement, kMxfp4ModulesToNotConvert};
  return family;
}

}  // namespace moepeak
