// The Mixtral family (model_type "mixtral", transformers' MixtralForCausalLM): grouped-query
// attention without biases or norms on q and k, every layer MoE — a router over all experts with a
// softmax, top-k and the k weights renormalised, SwiGLU experts of width intermediate_size — and
// Mixtral's own tensor names for the router and the experts:
//   model.layers.{l}.block_sparse_moe.gate.weight              (E, H)
//   model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight    (I, H)   gate
//   model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight    (I, H)   up
//   model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight    (H, I)   down
#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/families/hf_fields.h"

namespace moepeak {
namespace {

DecoderSpec describe(const ModelConfig& m) {
  require_experts_in_every_layer(m);
  require_no_deepseek_fields(m);
  if (!m.norm_topk_prob)
    unsupported_setting(m, "norm_topk_prob", "always renormalises the top-k weights");
  if (m.attention_bias) unsupported_setting(m, "attention_bias", "has no attention biases");
  require_full_attention_and_swiglu(m);
  DecoderSpec s = shared_decoder_spec(m);
  for (LayerSpec& l : s.layers) {
    l.mlp.kind = MlpKind::moe;
    l.mlp.intermediate = m.intermediate_size;
    l.mlp.experts = m.num_local_experts;
    l.mlp.router = RouterSpec{RouterScore::softmax_then_topk, m.num_experts_per_tok, true};
  }
  return s;
}

std::string tensor_name(const PieceRef& r) {
  const std::string moe = "model.layers." + std::to_string(r.layer) + ".block_sparse_moe.";
  const std::string expert = moe + "experts." + std::to_string(r.expert) + ".";
  switch (r.piece) {
    case Piece::router:
      return moe + "gate.weight";
    case Piece::expert_gate:
      return expert + "w1.weight";
    case Piece::expert_up:
      return expert + "w3.weight";
    case Piece::expert_down:
      return expert + "w2.weight";
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
  hf_fields::write_shared(m, "MixtralForCausalLM", "mixtral", dtype, j);
  j["num_local_experts"] = m.num_local_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.router_aux_loss_coef > 0;
  j["sliding_window"] = nullptr;
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& json, const std::string& source) {
  ModelConfig m;
  m.model_type = ModelType::mixtral;
  hf_fields::read_shared(json, source, m);
  m.num_local_experts = hf_fields::required_integer(json, source, "num_local_experts");
  m.num_experts_per_tok = hf_fields::required_integer(json, source, "num_experts_per_tok");
  m.router_aux_loss_coef = hf_fields::read_aux_loss_coef(json, source);
  const int64_t window = hf_fields::integer_or(json, source, "sliding_window", 0);
  if (window != 0 && window < m.max_position_embeddings) {
    MOEPEAK_INPUT_ERROR(source, ": field \"sliding_window\" is ", window,
                        "; sliding-window attention is not implemented for mixtral (null, or at "
                        "least max_position_embeddings ",
                        m.max_position_embeddings, ", is full attention)");
  }
  return m;
}

}  // namespace

const Family& mixtral_family() {
  static const Family family{ModelType::mixtral, "mixtral",     "MixtralForCausalLM",
                             describe,           tensor_name,   to_hf_config,
                             from_hf_config,     hub_placement, {}};
  return family;
}

}  // namespace moepeak
