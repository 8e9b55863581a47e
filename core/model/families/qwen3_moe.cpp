// The Qwen3-MoE family (model_type "qwen3_moe", transformers' Qwen3MoeForCausalLM): grouped-query
// attention with head_dim its own field and an RMSNorm over head_dim on every query and key head
// before RoPE; layer i dense (a SwiGLU MLP of width intermediate_size) when it is in
// mlp_only_layers or (i + 1) % decoder_sparse_step != 0, else MoE — a softmax router over all
// experts, top-k, the k weights renormalised only with norm_topk_prob, experts of width
// moe_intermediate_size; q/k/v/o biases with attention_bias. Tensor names:
//   model.layers.{l}.self_attn.{q,k}_norm.weight                  (d)
//   model.layers.{l}.mlp.gate.weight                              (E, H)   MoE layers
//   model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight   (I, H), (I, H), (H, I)
//   model.layers.{l}.mlp.{gate,up,down}_proj.weight               dense layers
#include <algorithm>

#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/families/hf_fields.h"

namespace moepeak {
namespace {

bool is_dense_layer(const ModelConfig& m, int64_t layer) {
  const bool listed = std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), layer) !=
                      m.mlp_only_layers.end();
  return listed || (layer + 1) % m.decoder_sparse_step != 0;
}

DecoderSpec describe(const ModelConfig& m) {
  require_full_attention_and_swiglu(m);
  require_no_deepseek_fields(m);
  DecoderSpec s = shared_decoder_spec(m);
  for (size_t i = 0; i < s.layers.size(); ++i) {
    LayerSpec& l = s.layers[i];
    l.attention.qk_norm = true;
    l.attention.bias = m.attention_bias;
    if (is_dense_layer(m, static_cast<int64_t>(i))) {
      l.mlp.kind = MlpKind::dense;
      l.mlp.intermediate = m.intermediate_size;
    } else {
      l.mlp.kind = MlpKind::moe;
      l.mlp.intermediate = m.expert_intermediate_size();
      l.mlp.experts = m.num_local_experts;
      l.mlp.router =
          RouterSpec{RouterScore::softmax_then_topk, m.num_experts_per_tok, m.norm_topk_prob};
    }
  }
  return s;
}

std::string tensor_name(const PieceRef& r) {
  const std::string mlp = "model.layers." + std::to_string(r.layer) + ".mlp.";
  const std::string expert = mlp + "experts." + std::to_string(r.expert) + ".";
  switch (r.piece) {
    case Piece::router:
      return mlp + "gate.weight";
    case Piece::expert_gate:
      return expert + "gate_proj.weight";
    case Piece::expert_up:
      return expert + "up_proj.weight";
    case Piece::expert_down:
      return expert + "down_proj.weight";
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
  hf_fields::write_shared(m, "Qwen3MoeForCausalLM", "qwen3_moe", dtype, j);
  j["num_experts"] = m.num_local_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["moe_intermediate_size"] = m.expert_intermediate_size();
  j["decoder_sparse_step"] = m.decoder_sparse_step;
  j["mlp_only_layers"] = m.mlp_only_layers;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.router_aux_loss_coef > 0;
  j["attention_bias"] = m.attention_bias;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& json, const std::string& source) {
  ModelConfig m;
  m.model_type = ModelType::qwen3_moe;
  hf_fields::read_shared(json, source, m);
  // NOTES: the Hub's files say num_experts; transformers 5 maps it to num_local_experts and its
  // save_pretrained writes that name instead.
  const bool hub_name =
      hf_fields::optional(json, "num_experts") || !hf_fields::optional(json, "num_local_experts");
  m.num_local_experts =
      hf_fields::required_integer(json, source, hub_name ? "num_experts" : "num_local_experts");
  m.num_experts_per_tok = hf_fields::required_integer(json, source, "num_experts_per_tok");
  m.moe_intermediate_size = hf_fields::required_integer(json, source, "moe_intermediate_size");
  // transformers' defaults where a field is absent.
  m.decoder_sparse_step = hf_fields::integer_or(json, source, "decoder_sparse_step", 1);
  m.norm_topk_prob = hf_fields::boolean_or(json, source, "norm_topk_prob", false);
  m.router_aux_loss_coef = hf_fields::read_aux_loss_coef(json, source);
  if (const nlohmann::json* layers = hf_fields::optional(json, "mlp_only_layers")) {
    if (!layers->is_array()) {
      MOEPEAK_INPUT_ERROR(source,
                          ": field \"mlp_only_layers\" must be a list of layer indices, "
                          "got ",
                          hf_fields::describe(*layers));
    }
    for (const nlohmann::json& layer : *layers) {
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
          layer.get<int64_t>() >= m.num_hidden_layers) {
        MOEPEAK_INPUT_ERROR(source, ": field \"mlp_only_layers\" holds ", layer.dump(),
                            ", which is not a layer of num_hidden_layers ", m.num_hidden_layers);
      }
      m.mlp_only_layers.push_back(layer.get<int64_t>());
    }
  }
  if (m.decoder_sparse_step < 1) {
    MOEPEAK_INPUT_ERROR(source, ": field \"decoder_sparse_step\" is ", m.decoder_sparse_step,
                        "; it must be at least 1");
  }
  m.attention_bias = hf_fields::boolean_or(json, source, "attention_bias", false);
  hf_fields::expect_boolean(json, source, "use_sliding_window", false,
                            "qwen3_moe's sliding-window attention is not implemented (every "
                            "released Qwen3-MoE has it off)");
  return m;
}

}  // namespace

const Family& qwen3_moe_family() {
  static const Family family{
      ModelType::qwen3_moe, "qwen3_moe",    "Qwen3MoeForCausalLM", describe, tensor_name,
      to_hf_config,         from_hf_config, hub_placement,         {}};
  return family;
}

}  // namespace moepeak
