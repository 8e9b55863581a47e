// The DeepSeek-V3 family (model_type "deepseek_v3", transformers' DeepseekV3ForCausalLM; Kimi-K2's
// config.json, model_type "kimi_k2", reads the same): multi-head latent attention (the query
// through a q_lora_rank bottleneck or a plain q_proj, keys and values from one kv_lora_rank latent,
// q/k heads of qk_nope_head_dim + qk_rope_head_dim with RoPE on the rope part only, the key's one
// rotary vector shared by every head, value heads of v_head_dim, interleaved RoPE pairs, the
// softmax scale qk_head_dim^-0.5 times YaRN's squared mscale_all_dim factor); the first
// first_k_dense_replace layers dense (width intermediate_size), the others MoE — sigmoid scores,
// e_score_correction_bias added for the choice, the best topk_group of n_group groups, the k
// weights the unbiased scores (renormalised with norm_topk_prob) times routed_scaling_factor —
// with n_shared_experts always-on experts beside the routed ones. Tensor names:
//   model.layers.{l}.self_attn.q_a_proj.weight                     (r_q, H)
//   model.layers.{l}.self_attn.q_a_layernorm.weight                (r_q)
//   model.layers.{l}.self_attn.q_b_proj.weight                     (nh d, r_q)  (q_proj: (nh d, H))
//   model.layers.{l}.self_attn.kv_a_proj_with_mqa.weight           (r_kv + rope, H)
//   model.layers.{l}.self_attn.kv_a_layernorm.weight               (r_kv)
//   model.layers.{l}.self_attn.kv_b_proj.weight                    (nh (nope + dv), r_kv)
//   model.layers.{l}.self_attn.o_proj.weight                       (H, nh dv)
//   model.layers.{l}.mlp.gate.weight, .e_score_correction_bias     (E, H), (E)
//   model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight    (I, H), (I, H), (H, I)
//   model.layers.{l}.mlp.shared_experts.{gate,up,down}_proj.weight (Is, H), (Is, H), (H, Is)
//   model.layers.{l}.mlp.{gate,up,down}_proj.weight                dense layers
// The released checkpoints' multi-token-prediction layers (model.layers.{L}.*, L >=
// num_hidden_layers) are not part of the decoder: the import carries them to the export as they
// are (core/checkpoint/hf_import.h).
#include <cmath>

#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/families/hf_fields.h"

namespace moepeak {
namespace {

// transformers' yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 for factor > 1.
double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// The softmax scale of transformers' DeepseekV3Attention: yarn_apply_mscale(rope_parameters,
// qk_head_dim^-0.5), i.e. times mscale(factor, mscale_all_dim)^2 when the RoPE is scaled and
// mscale_all_dim is set.
double softmax_scale(const ModelConfig& m) {
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
  if (m.rope_type != RopeType::default_rope && m.rope_mscale_all_dim > 0) {
    const double f = yarn_mscale(m.rope_factor, m.rope_mscale_all_dim);
    scale = scale * f * f;
  }
  return scale;
}

void check_shape(const ModelConfig& m) {
  auto require = [&](bool ok, std::string_view key, std::string_view why) {
    if (!ok) MOEPEAK_INPUT_ERROR("model.", key, ": the deepseek_v3 family ", why);
  };
  require(m.kv_lora_rank >= 1, "kv_lora_rank", "needs the key/value latent width (>= 1)");
  require(m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
          "needs an even rotary part of at least 2 dims");
  require(m.qk_nope_head_dim >= 1, "qk_nope_head_dim", "needs a non-rotary part (>= 1)");
  require(m.v_head_dim >= 1, "v_head_dim", "needs the value head width (>= 1)");
  require(m.head_dim == 0 || m.head_dim == m.qk_nope_head_dim + m.qk_rope_head_dim, "head_dim",
          "takes the query/key head width from qk_nope_head_dim + qk_rope_head_dim (leave "
          "head_dim 0 or set it to their sum)");
  require(m.num_key_value_heads == m.num_attention_heads, "num_key_value_heads",
          "expands every query head's own key and value from the latent (set it to "
          "num_attention_heads)");
  const int64_t E = m.num_local_experts, groups = m.n_group;
  require(E % groups == 0, "n_group", "needs num_local_experts divisible by n_group");
  require(groups == 1 || E / groups >= 2, "n_group",
          "scores a group by its two best experts: each group needs at least 2");
  require(m.topk_group <= groups, "topk_group", "keeps at most n_group groups");
  require(m.num_experts_per_tok <= m.topk_group * (E / groups), "num_experts_per_tok",
          "chooses its experts within the topk_group groups kept (at most topk_group * "
          "num_local_experts / n_group)");
  require(m.first_k_dense_replace <= m.num_hidden_layers, "first_k_dense_replace",
          "has at most num_hidden_layers dense layers");
}

DecoderSpec describe(const ModelConfig& m) {
  require_full_attention_and_swiglu(m);
  const ModelConfig defaults;
  if (!m.mlp_only_layers.empty())
    unsupported_setting(m, "mlp_only_layers", "makes its first first_k_dense_replace layers dense");
  if (m.decoder_sparse_step != defaults.decoder_sparse_step)
    unsupported_setting(m, "decoder_sparse_step",
                        "makes its first first_k_dense_replace layers dense");
  if (m.attention_bias)
    unsupported_setting(m, "attention_bias",
                        "is implemented without attention biases (every released DeepSeek-V3 and "
                        "Kimi-K2 has none)");
  check_shape(m);
  DecoderSpec s = shared_decoder_spec(m);
  // router_aux_loss_coef = alpha of DeepSeek-V3's complementary sequence-wise balance loss (off
  // by default: the correction bias balances the experts; transformers has no such loss).
  s.aux_loss_per_sequence = true;
  s.rope.rotary_dim = m.qk_rope_head_dim;
  s.rope.interleaved = m.rope_interleave;
  const double scale = softmax_scale(m);
  for (size_t i = 0; i < s.layers.size(); ++i) {
    LayerSpec& l = s.layers[i];
    AttentionSpec& a = l.attention;
    a.kind = AttentionKind::latent;
    a.heads = a.kv_heads = m.num_attention_heads;
    a.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
    a.v_head_dim = m.v_head_dim;
    a.scale = scale;
    a.q_lora_rank = m.q_lora_rank;
    a.kv_lora_rank = m.kv_lora_rank;
    a.rope_dim = m.qk_rope_head_dim;
    a.latent_norm_eps = 1e-6;  // DeepseekV3RMSNorm's default: the latent norms take no eps
    if (static_cast<int64_t>(i) < m.first_k_dense_replace) {
      l.mlp.kind = MlpKind::dense;
      l.mlp.intermediate = m.intermediate_size;
    } else {
      l.mlp.kind = MlpKind::moe;
      l.mlp.intermediate = m.expert_intermediate_size();
      l.mlp.experts = m.num_local_experts;
      RouterSpec& r = l.mlp.router;
      r.score = RouterScore::sigmoid_group_limited;
      r.top_k = m.num_experts_per_tok;
      r.renormalize = m.norm_topk_prob;
      r.groups = m.n_group;
      r.topk_groups = m.topk_group;
      r.scaling = m.routed_scaling_factor;
      r.correction_bias = true;
      l.mlp.shared_intermediate = m.n_shared_experts * m.expert_intermediate_size();
    }
  }
  return s;
}

std::string tensor_name(const PieceRef& r) {
  const std::string layer = "model.layers." + std::to_string(r.layer) + ".";
  const std::string attn = layer + "self_attn.", mlp = layer + "mlp.";
  const std::string expert = mlp + "experts." + std::to_string(r.expert) + ".";
  switch (r.piece) {
    case Piece::q_a:
      return attn + "q_a_proj.weight";
    case Piece::q_a_norm:
      return attn + "q_a_layernorm.weight";
    case Piece::q_b:
      return attn + "q_b_proj.weight";
    case Piece::kv_a:
      return attn + "kv_a_proj_with_mqa.weight";
    case Piece::kv_a_norm:
      return attn + "kv_a_layernorm.weight";
    case Piece::kv_b:
      return attn + "kv_b_proj.weight";
    case Piece::router:
      return mlp + "gate.weight";
    case Piece::router_correction_bias:
      return mlp + "gate.e_score_correction_bias";
    case Piece::expert_gate:
      return expert + "gate_proj.weight";
    case Piece::expert_up:
      return expert + "up_proj.weight";
    case Piece::expert_down:
      return expert + "down_proj.weight";
    case Piece::shared_gate:
      return mlp + "shared_experts.gate_proj.weight";
    case Piece::shared_up:
      return mlp + "shared_experts.up_proj.weight";
    case Piece::shared_down:
      return mlp + "shared_experts.down_proj.weight";
    default:
      return llama_tensor_name(r);
  }
}

// Every piece is a Hub tensor of its own, under its name.
HubPlacement hub_placement(const DecoderSpec&, const PieceRef& ref,
                           const std::vector<int64_t>& dims) {
  return whole_hub_tensor(tensor_name(ref), dims);
}

nlohmann::json to_hf_config(const ModelConfig& m, std::string_view dtype) {
  nlohmann::json j;
  hf_fields::write_shared(m, "DeepseekV3ForCausalLM", "deepseek_v3", dtype, j);
  // transformers' DeepseekV3Config sets head_dim to the rotary part (the RoPE's dims).
  j["head_dim"] = m.qk_rope_head_dim;
  j["n_routed_experts"] = m.num_local_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["moe_intermediate_size"] = m.expert_intermediate_size();
  j["n_shared_experts"] = m.n_shared_experts;
  j["n_group"] = m.n_group;
  j["topk_group"] = m.topk_group;
  j["routed_scaling_factor"] = m.routed_scaling_factor;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["first_k_dense_replace"] = m.first_k_dense_replace;
  j["moe_layer_freq"] = 1;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["q_lora_rank"] = m.q_lora_rank > 0 ? nlohmann::json(m.q_lora_rank) : nlohmann::json(nullptr);
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["rope_interleave"] = m.rope_interleave;
  j["attention_bias"] = false;
  j["num_nextn_predict_layers"] = m.num_nextn_predict_layers;
  // DeepSeek's own names for the sequence-wise balance loss (its release's config.json and
  // modeling code; transformers reads neither); an import does not read them back, as the
  // loss's weight is a training choice.
  if (m.router_aux_loss_coef > 0) {
    j["aux_loss_alpha"] = m.router_aux_loss_coef;
    j["seq_aux"] = true;
  }
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& json, const std::string& source) {
  ModelConfig m;
  m.model_type = ModelType::deepseek_v3;
  // transformers: a missing or null num_key_value_heads is num_attention_heads.
  nlohmann::json filled = json;
  if (!hf_fields::optional(json, "num_key_value_heads") && json.contains("num_attention_heads"))
    filled["num_key_value_heads"] = json["num_attention_heads"];
  // head_dim, where present, is the rotary part (transformers sets it so): moepeak's is the whole
  // query/key head, set below.
  filled.erase("head_dim");
  hf_fields::read_shared(filled, source, m);
  // NOTES: DeepSeek's files say n_routed_experts; transformers 5's save_pretrained may write the
  // attribute_map's num_local_experts instead.
  const bool hub_name = hf_fields::optional(json, "n_routed_experts") ||
                        !hf_fields::optional(json, "num_local_experts");
  m.num_local_experts = hf_fields::required_integer(
      json, source, hub_name ? "n_routed_experts" : "num_local_experts");
  m.num_experts_per_tok = hf_fields::required_integer(json, source, "num_experts_per_tok");
  m.moe_intermediate_size = hf_fields::required_integer(json, source, "moe_intermediate_size");
  m.kv_lora_rank = hf_fields::required_integer(json, source, "kv_lora_rank");
  m.qk_nope_head_dim = hf_fields::required_integer(json, source, "qk_nope_head_dim");
  m.qk_rope_head_dim = hf_fields::required_integer(json, source, "qk_rope_head_dim");
  m.v_head_dim = hf_fields::required_integer(json, source, "v_head_dim");
  m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  // q_lora_rank: null = a plain q_proj (0 here).
  m.q_lora_rank = hf_fields::integer_or(json, source, "q_lora_rank", 0);
  // transformers' defaults where a field is absent.
  m.n_shared_experts = hf_fields::integer_or(json, source, "n_shared_experts", 1);
  m.n_group = hf_fields::integer_or(json, source, "n_group", 8);
  m.topk_group = hf_fields::integer_or(json, source, "topk_group", 4);
  m.routed_scaling_factor = hf_fields::number_or(json, source, "routed_scaling_factor", 2.5);
  m.norm_topk_prob = hf_fields::boolean_or(json, source, "norm_topk_prob", true);
  m.first_k_dense_replace = hf_fields::integer_or(json, source, "first_k_dense_replace", 3);
  m.rope_interleave = hf_fields::boolean_or(json, source, "rope_interleave", true);
  m.num_nextn_predict_layers = hf_fields::integer_or(json, source, "num_nextn_predict_layers", 0);
  hf_fields::expect_string(json, source, "scoring_func", "sigmoid",
                           "only DeepSeek-V3's sigmoid router is implemented");
  hf_fields::expect_string(json, source, "topk_method", "noaux_tc",
                           "only DeepSeek-V3's group-limited top-k with the correction bias is "
                           "implemented");
  if (hf_fields::integer_or(json, source, "moe_layer_freq", 1) != 1) {
    MOEPEAK_INPUT_ERROR(source,
                        ": field \"moe_layer_freq\" is not 1; moepeak's deepseek_v3 has experts "
                        "in every layer from first_k_dense_replace on");
  }
  hf_fields::expect_boolean(json, source, "attention_bias", false,
                            "deepseek_v3's attention biases are not implemented (every released "
                            "DeepSeek-V3 and Kimi-K2 has none)");
  auto positive = [&](int64_t value, const char* field) {
    if (value < 1) {
      MOEPEAK_INPUT_ERROR(source, ": field \"", field, "\" is ", value, "; it must be at least 1");
    }
  };
  positive(m.kv_lora_rank, "kv_lora_rank");
  positive(m.qk_rope_head_dim, "qk_rope_head_dim");
  positive(m.v_head_dim, "v_head_dim");
  positive(m.n_group, "n_group");
  positive(m.topk_group, "topk_group");
  if (m.q_lora_rank < 0 || m.n_shared_experts < 0 || m.first_k_dense_replace < 0 ||
      m.num_nextn_predict_layers < 0) {
    MOEPEAK_INPUT_ERROR(source,
                        ": q_lora_rank, n_shared_experts, first_k_dense_replace and "
                        "num_nextn_predict_layers must not be negative");
  }
  return m;
}

constexpr std::string_view kAliases[] = {"kimi_k2"};

}  // namespace

const Family& deepseek_v3_family() {
  static const Family family{
      ModelType::deepseek_v3, "deepseek_v3",  "DeepseekV3ForCausalLM", describe, tensor_name,
      to_hf_config,           from_hf_config, hub_placement,           {},       kAliases};
  return family;
}

}  // namespace moepeak
