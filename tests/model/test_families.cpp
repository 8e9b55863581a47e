// The model families (core/model/families/): each family's description of the decoder, its Hub
// tensor names, its config.json read and written in both transformers forms (RoPE scaling
// included), and the settings a family refuses — by name, never silently run with another
// family's semantics. Run: ctest -R test_families
#include <gtest/gtest.h>

#include <string>

#include "core/checkpoint/hf_config.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/model/decoder_spec.h"
#include "core/model/families/family.h"
#include "core/model/param_layout.h"
#include "tests/expect_contains.h"
#include "tests/source_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

ModelConfig qwen3(int64_t layers = 3) {
  ModelConfig m;
  m.model_type = ModelType::qwen3_moe;
  m.vocab_size = 50;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.moe_intermediate_size = 8;
  m.num_hidden_layers = layers;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 6;  // not hidden / heads
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  return m;
}

TEST(Families, Qwen3DescribesDenseLayersByListAndStep) {
  ModelConfig m = qwen3(6);
  m.mlp_only_layers = {2};
  m.decoder_sparse_step = 2;
  m.norm_topk_prob = false;
  const DecoderSpec s = describe_decoder(m);
  ASSERT_EQ(s.layers.size(), 6u);
  // (i + 1) % 2 != 0 -> dense: 0, 2, 4; 2 listed too; MoE: 1, 3, 5.
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    const LayerSpec& l = s.layers[i];
    EXPECT_TRUE(l.attention.qk_norm);
    EXPECT_EQ(l.attention.head_dim, 6);
    EXPECT_EQ(l.mlp.moe(), i % 2 == 1);
    EXPECT_EQ(l.mlp.intermediate, l.mlp.moe() ? 8 : 24);
    if (l.mlp.moe()) {
      EXPECT_EQ(l.mlp.experts, 4);
      EXPECT_EQ(l.mlp.router.top_k, 2);
      EXPECT_FALSE(l.mlp.router.renormalize);
    }
  }
  EXPECT_EQ(s.moe_layers(), 3);
  EXPECT_EQ(s.experts(), 4);
}

TEST(Families, MixtralDescribesEveryLayerMoeWithoutQkNorm) {
  ModelConfig m;
  const DecoderSpec s = describe_decoder(m);
  for (const LayerSpec& l : s.layers) {
    EXPECT_FALSE(l.attention.qk_norm);
    EXPECT_TRUE(l.mlp.moe());
    EXPECT_TRUE(l.mlp.router.renormalize);
    EXPECT_EQ(l.mlp.intermediate, m.intermediate_size);
  }
}

TEST(Families, Qwen3ParamsCarryTheHubNames) {
  ModelConfig m = qwen3(2);
  m.mlp_only_layers = {0};
  const ParamLayout P(m);
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  for (const char* name : {"self_attn.q_norm.weight", "self_attn.k_norm.weight",
                           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
    EXPECT_GE(P.find(l0 + name), 0) << name;
  }
  for (const char* name : {"mlp.gate.weight", "mlp.experts.3.gate_proj.weight",
                           "mlp.experts.3.up_proj.weight", "mlp.experts.0.down_proj.weight"}) {
    EXPECT_GE(P.find(l1 + name), 0) << name;
    EXPECT_EQ(P.find(l0 + name), -1) << name;  // layer 0 is dense
  }
  EXPECT_EQ(P.params()[P.find(l0 + "self_attn.q_norm.weight")].shape, (Shape{6}));
  EXPECT_EQ(P.params()[P.find(l0 + "mlp.gate_proj.weight")].shape, (Shape{24, 16}));
  EXPECT_EQ(P.params()[P.find(l1 + "mlp.experts.3.down_proj.weight")].shape, (Shape{16, 8}));
  EXPECT_EQ(P.params()[P.find(l1 + "self_attn.q_proj.weight")].shape, (Shape{24, 16}));
  EXPECT_GE(P.find("lm_head.weight"), 0);
  EXPECT_FALSE(P.tied());
  // Embedding, head, final norm; per layer 4 projections, 4 norms (2 layer, q, k); layer 0 three
  // dense matrices, layer 1 a router and 4 x 3 expert matrices.
  EXPECT_EQ(P.params().size(), 3u + 2 * 8 + 3 + 1 + 12);
}

TEST(Families, ATiedHeadIsTheEmbedding) {
  for (ModelType type : {ModelType::mixtral, ModelType::qwen3_moe}) {
    ModelConfig m = qwen3(2);
    m.model_type = type;
    if (type == ModelType::mixtral) m.moe_intermediate_size = 0;
    m.tie_word_embeddings = true;
    const ParamLayout P(m);
    EXPECT_TRUE(P.tied());
    EXPECT_EQ(P.lm_head, P.embed);
    EXPECT_EQ(P.find("lm_head.weight"), -1);
  }
}

TEST(Families, MixtralRefusesQwen3Settings) {
  struct Case {
    const char* key;
    void (*set)(ModelConfig&);
  };
  const Case cases[] = {
      {"model.mlp_only_layers", [](ModelConfig& m) { m.mlp_only_layers = {0}; }},
      {"model.decoder_sparse_step", [](ModelConfig& m) { m.decoder_sparse_step = 2; }},
      {"model.norm_topk_prob", [](ModelConfig& m) { m.norm_topk_prob = false; }},
      {"model.moe_intermediate_size", [](ModelConfig& m) { m.moe_intermediate_size = 7; }},
      {"model.attention_bias", [](ModelConfig& m) { m.attention_bias = true; }},
      {"model.sliding_window", [](ModelConfig& m) { m.sliding_window = 4; }},
      {"model.layer_types",
       [](ModelConfig& m) { m.layer_types.assign(2, AttentionLayerType::full_attention); }},
      {"model.swiglu_limit", [](ModelConfig& m) { m.swiglu_limit = 3; }},
      {"model.swiglu_alpha", [](ModelConfig& m) { m.swiglu_alpha = 1; }},
  };
  for (const Case& c : cases) {
    ModelConfig m;
    c.set(m);
    EXPECT_CONTAINS(error_of([&] { describe_decoder(m); }), c.key);
    EXPECT_CONTAINS(error_of([&] { ParamLayout layout(m); }), "the mixtral family");
  }
}

TEST(Families, Qwen3RefusesGptOssSettingsButTakesAttentionBias) {
  ModelConfig m = qwen3(2);
  m.attention_bias = true;
  const DecoderSpec spec = describe_decoder(m);
  EXPECT_TRUE(spec.layers[0].attention.bias);
  EXPECT_FALSE(spec.layers[0].attention.sinks);
  const ParamLayout P(m);
  EXPECT_GE(P.find("model.layers.1.self_attn.o_proj.bias"), 0);
  m.sliding_window = 8;
  EXPECT_CONTAINS(error_of([&] { describe_decoder(m); }), "model.sliding_window");
}

// ---- gpt-oss ---------------------------------------------------------------------------------

ModelConfig gpt_oss(int64_t layers = 3) {
  ModelConfig m;
  m.model_type = ModelType::gpt_oss;
  m.vocab_size = 50;
  m.hidden_size = 16;
  m.intermediate_size = 12;
  m.num_hidden_layers = layers;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 6;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.attention_bias = true;
  m.sliding_window = 5;
  m.swiglu_limit = 0.75;
  return m;
}

TEST(Families, GptOssDescribesSinksWindowsBiasesAndItsRouter) {
  const DecoderSpec spec = describe_decoder(gpt_oss(3));
  ASSERT_EQ(spec.layers.size(), 3u);
  // transformers' default layer_types: even layers sliding, odd full.
  EXPECT_EQ(spec.layers[0].attention.window, 5);
  EXPECT_EQ(spec.layers[1].attention.window, 0);
  EXPECT_EQ(spec.layers[2].attention.window, 5);
  for (const LayerSpec& l : spec.layers) {
    EXPECT_TRUE(l.attention.bias);
    EXPECT_TRUE(l.attention.sinks);
    EXPECT_FALSE(l.attention.qk_norm);
    ASSERT_TRUE(l.mlp.moe());
    EXPECT_EQ(l.mlp.router.score, RouterScore::topk_then_softmax);
    EXPECT_TRUE(l.mlp.router.bias);
    EXPECT_EQ(l.mlp.router.top_k, 2);
    EXPECT_EQ(l.mlp.activation, ExpertActivation::clamped_swiglu);
    EXPECT_EQ(l.mlp.swiglu_limit, 0.75);
    EXPECT_EQ(l.mlp.swiglu_alpha, 1.702);
    EXPECT_TRUE(l.mlp.bias);
  }
  // Explicit layer types win; sliding_window 0 is transformers' default window, 128.
  ModelConfig m = gpt_oss(2);
  m.layer_types = {AttentionLayerType::full_attention, AttentionLayerType::sliding_attention};
  EXPECT_EQ(describe_decoder(m).layers[0].attention.window, 0);
  EXPECT_EQ(describe_decoder(m).layers[1].attention.window, 5);
  m.sliding_window = 0;
  EXPECT_EQ(describe_decoder(m).layers[1].attention.window, 128);
  m.norm_topk_prob = false;
  EXPECT_CONTAINS(error_of([&] { describe_decoder(m); }), "model.norm_topk_prob");
}

TEST(Families, GptOssParamsAndCounts) {
  const ModelConfig m = gpt_oss(2);
  const ParamLayout P(m);
  const int64_t H = 16, I = 12, E = 4, V = 50, nh = 4, nkv = 2, d = 6;
  for (const char* name :
       {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias", "model.layers.0.self_attn.o_proj.bias",
        "model.layers.1.self_attn.sinks", "model.layers.1.mlp.router.weight",
        "model.layers.1.mlp.router.bias", "model.layers.1.mlp.experts.3.gate_proj.bias",
        "model.layers.1.mlp.experts.3.up_proj.bias",
        "model.layers.1.mlp.experts.3.down_proj.bias"}) {
    EXPECT_GE(P.find(name), 0) << name;
  }
  const ParamInfo& sinks = P.params()[P.find("model.layers.0.self_attn.sinks")];
  EXPECT_EQ(sinks.shape, (Shape{nh}));
  EXPECT_FALSE(sinks.decays);
  EXPECT_FALSE(sinks.is_norm);
  EXPECT_TRUE(P.params()[P.find("model.layers.0.self_attn.q_proj.weight")].decays);
  EXPECT_FALSE(P.params()[P.find("model.layers.0.self_attn.q_proj.bias")].decays);
  const LayerParamIndex& L = P.layers[1];
  ASSERT_EQ(L.b1.size(), size_t(E));
  EXPECT_EQ(P.expert_index()[L.b2[3]], 3);
  EXPECT_EQ(P.params()[L.b2[3]].shape, (Shape{H}));
  // Per layer: attention (weights and biases, sinks), norms, router (and bias), experts.
  const int64_t attention = (2 * nh * d + 2 * nkv * d) * H + nh * d + 2 * nkv * d + H + nh;
  const int64_t experts = E * (3 * I * H + 2 * I + H);
  const int64_t layer = attention + 2 * H + E * H + E + experts;
  EXPECT_EQ(P.parameter_count(), 2 * V * H + H + 2 * layer);
}

TEST(Families, GptOssConfigJsonIsTransformersAndRoundTrips) {
  ModelConfig m = gpt_oss(4);
  m.router_aux_loss_coef = 0.9;
  m.max_position_embeddings = 131072;
  m.rope_theta = 150000;
  m.rope_type = RopeType::yarn;
  m.rope_factor = 32;
  m.rope_original_max_position_embeddings = 4096;
  m.rope_truncate = false;
  const nlohmann::json j = model_config_json(m, "bfloat16");
  EXPECT_EQ(j["model_type"], "gpt_oss");
  EXPECT_EQ(j["architectures"][0], "GptOssForCausalLM");
  EXPECT_EQ(j["layer_types"], nlohmann::json::array({"sliding_attention", "full_attention",
                                                     "sliding_attention", "full_attention"}));
  EXPECT_EQ(j["sliding_window"], 5);
  EXPECT_EQ(j["attention_bias"], true);
  EXPECT_EQ(j["swiglu_limit"], 0.75);
  EXPECT_EQ(j["num_local_experts"], 4);
  EXPECT_EQ(j["rope_scaling"]["truncate"], false);
  // The family's default layer types are written out, and read back as given.
  ModelConfig back = m;
  back.layer_types = {AttentionLayerType::sliding_attention, AttentionLayerType::full_attention,
                      AttentionLayerType::sliding_attention, AttentionLayerType::full_attention};
  EXPECT_EQ(model_config_from_json(j, "c.json"), back);
  // OpenAI's own spelling of top-k; transformers' defaults for what is absent.
  nlohmann::json openai = j;
  openai.erase("num_experts_per_tok");
  openai.erase("attention_bias");
  openai.erase("swiglu_alpha");
  openai.erase("sliding_window");
  const ModelConfig read = model_config_from_json(openai, "c.json");
  EXPECT_EQ(read.num_experts_per_tok, 2);
  EXPECT_TRUE(read.attention_bias);
  EXPECT_EQ(read.swiglu_alpha, 1.702);
  EXPECT_EQ(read.sliding_window, 128);
  openai["sliding_window"] = nullptr;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(openai, "hub/config.json"); }),
                  "hub/config.json: field \"sliding_window\" is null");
  nlohmann::json bad = j;
  bad["layer_types"][2] = "chunked_attention";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(bad, "hub/config.json"); }),
                  "hub/config.json: field \"layer_types\"[2] is \"chunked_attention\"");
  bad["layer_types"] = nlohmann::json::array({"full_attention"});
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(bad, "hub/config.json"); }),
                  "must list num_hidden_layers 4 layer types");
}

// The presets are the released models: their parameter counts are OpenAI's published totals
// (model card: 20.91B and 116.83B parameters, 3.61B and 5.13B active with the unembedding).
TEST(Families, GptOssPresetsHaveThePublishedParameterCounts) {
  struct Preset {
    const char* name;
    int64_t total;
    double active_billions;
  };
  for (const Preset& p : {Preset{"gpt-oss-20b", 20'914'757'184, 3.61},
                          Preset{"gpt-oss-120b", 116'829'156'672, 5.13}}) {
    SCOPED_TRACE(p.name);
    const Config cfg =
        load_config({test_support::source_dir() + "/configs/" + p.name + ".toml"}, {});
    const ParamLayout P(cfg.model);
    EXPECT_EQ(P.parameter_count(), p.total);
    EXPECT_NEAR(static_cast<double>(P.active_matmul_parameters()) / 1e9, p.active_billions, 0.005);
    const DecoderSpec& spec = P.spec();
    EXPECT_EQ(spec.layers[0].attention.window, 128);
    EXPECT_EQ(spec.layers[1].attention.window, 0);
    EXPECT_TRUE(spec.any_sinks());
    EXPECT_TRUE(spec.any_attention_bias());
    EXPECT_EQ(spec.rope.scaling.type, ops::RopeType::yarn);
    EXPECT_FALSE(spec.rope.scaling.truncate);
  }
}

// A sliding layer's attention FLOPs count the (query, key) pairs it scores, not T^2.
TEST(Families, StepFlopsCountAWindowsPairs) {
  ModelConfig m = gpt_oss(2);  // layer 0 sliding (W 5), layer 1 full
  const int64_t B = 3, T = 40, nh = 4, d = 6;
  const double matmuls =
      6.0 * B * T * static_cast<double>(ParamLayout(m).active_matmul_parameters());
  const double full = 6.0 * B * nh * d * T * T;
  const double pairs = 5 * 6 / 2 + (T - 5) * 5, causal = T * (T + 1) / 2.0;
  EXPECT_DOUBLE_EQ(step_flops(m, B, T), matmuls + full * (1 + pairs / causal));
  m.layer_types.assign(2, AttentionLayerType::full_attention);
  EXPECT_DOUBLE_EQ(step_flops(m, B, T), matmuls + 2 * full);
  // A window at least T long is full attention.
  m.layer_types.assign(2, AttentionLayerType::sliding_attention);
  m.sliding_window = T;
  EXPECT_DOUBLE_EQ(step_flops(m, B, T), matmuls + 2 * full);
}

// DeepSeek-V3's latent attention: the projections (q_a, q_b, kv_a, kv_b, o), the dense first
// layers and the shared experts through the layout's active matrices, and the scores and values
// at the spec's head widths, d = 128 + 64 for q.k and dv = 128 for p.v (not head_dim twice), by
// hand from configs/deepseek-v3.toml.
TEST(Families, StepFlopsOfLatentAttentionAndSharedExperts) {
  const Config cfg = load_config({test_support::source_dir() + "/configs/deepseek-v3.toml"}, {});
  const double H = 7168, nh = 128, d = 192, dv = 128, rq = 1536, rkv = 512, rope = 64;
  const double attention =
      rq * H + nh * d * rq + (rkv + rope) * H + nh * (128 + dv) * rkv + H * nh * dv;  // 187,105,280
  const double dense = 3 * 18432 * H;                                                 // 396,361,728
  const double moe = 256 * H + 8 * 3 * 2048 * H + 3 * 2048 * H;  // router, top-8, shared
  const double active = 61 * attention + 3 * dense + 58 * moe + 129280 * H;
  EXPECT_EQ(active, 36'624'596'992.0);
  EXPECT_EQ(static_cast<double>(ParamLayout(cfg.model).active_matmul_parameters()), active);
  const int64_t B = 2, T = 4096;
  // Per causal pair 2 (d + dv) forward, twice that backward: 3 (d + dv) per head and T^2.
  const double scores = 3.0 * B * 61 * nh * T * T * (d + dv);
  EXPECT_DOUBLE_EQ(step_flops(cfg.model, B, T), 6.0 * B * T * active + scores);
  EXPECT_DOUBLE_EQ(scores, 2 * 125'756'642'426'880.0);
}

TEST(Families, TomlSetsTheFamilyAndItsLists) {
  const Config cfg = load_config(
      {}, {"model.model_type=qwen3_moe", "model.mlp_only_layers=[0, 1]", "model.rope_type=yarn",
           "model.rope_factor=8", "model.rope_original_max_position_embeddings=64"});
  EXPECT_EQ(cfg.model.model_type, ModelType::qwen3_moe);
  EXPECT_EQ(cfg.model.mlp_only_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(cfg.model.rope_type, RopeType::yarn);
  // Written back as TOML that reads to the same settings.
  EXPECT_CONTAINS(config_to_toml(cfg, false), "mlp_only_layers = [0, 1]");
  EXPECT_CONTAINS(error_of([&] { load_config({}, {"model.model_type=gpt_neox"}); }),
                  "model.model_type");
  EXPECT_CONTAINS(error_of([&] { load_config({}, {"model.rope_type=longrope"}); }),
                  "model.rope_type");
  EXPECT_CONTAINS(error_of([&] { load_config({}, {"model.mlp_only_layers=[0, \"a\"]"}); }),
                  "model.mlp_only_layers[1]: expected an integer");
  EXPECT_CONTAINS(error_of([&] { load_config({}, {"model.mlp_only_layers=[5]"}); }),
                  "model.mlp_only_layers[0] = 5");
  // A list of enumerators.
  const Config oss =
      load_config({}, {"model.model_type=gpt_oss", "model.num_hidden_layers=2",
                       "model.layer_types=[\"full_attention\", \"sliding_attention\"]"});
  EXPECT_EQ(oss.model.layer_types,
            (std::vector<AttentionLayerType>{AttentionLayerType::full_attention,
                                             AttentionLayerType::sliding_attention}));
  EXPECT_CONTAINS(config_to_toml(oss, false),
                  "layer_types = [\"full_attention\", \"sliding_attention\"]");
  EXPECT_CONTAINS(error_of([&] {
                    load_config({}, {"model.num_hidden_layers=2",
                                     "model.layer_types=[\"full_attention\", \"slide\"]"});
                  }),
                  "model.layer_types[1] must be one of");
  EXPECT_CONTAINS(
      error_of([&] {
        load_config({}, {"model.num_hidden_layers=3", "model.layer_types=[\"full_attention\"]"});
      }),
      "lists 1 layers");
}

// ---- config.json -----------------------------------------------------------------------------

ModelConfig yarn_qwen3() {
  ModelConfig m = qwen3();
  m.mlp_only_layers = {1};
  m.norm_topk_prob = false;
  m.tie_word_embeddings = true;
  m.router_aux_loss_coef = 0.01;
  m.max_position_embeddings = 32768;
  m.rope_theta = 1e6;
  m.rope_type = RopeType::yarn;
  m.rope_factor = 8;
  m.rope_original_max_position_embeddings = 4096;
  m.rope_truncate = false;
  m.rope_mscale = 1.0;
  m.rope_mscale_all_dim = 1.0;
  return m;
}

TEST(Families, Qwen3ConfigJsonIsTransformersAndRoundTrips) {
  const ModelConfig m = yarn_qwen3();
  const nlohmann::json j = model_config_json(m, "bfloat16");
  EXPECT_EQ(j["model_type"], "qwen3_moe");
  EXPECT_EQ(j["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(j["num_experts"], 4);
  EXPECT_EQ(j["moe_intermediate_size"], 8);
  EXPECT_EQ(j["intermediate_size"], 24);
  EXPECT_EQ(j["mlp_only_layers"], nlohmann::json::array({1}));
  EXPECT_EQ(j["norm_topk_prob"], false);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["head_dim"], 6);
  EXPECT_EQ(j["output_router_logits"], true);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(j["rope_scaling"]["truncate"], false);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], 1e6);
  EXPECT_EQ(j["rope_parameters"]["original_max_position_embeddings"], 4096);
  EXPECT_EQ(model_config_from_json(j, "c.json"), m);

  // transformers 5 alone (rope_parameters), transformers 4 alone (rope_theta + rope_scaling).
  nlohmann::json five = j;
  five.erase("rope_scaling");
  five.erase("rope_theta");
  EXPECT_EQ(model_config_from_json(five, "c.json"), m);
  nlohmann::json four = j;
  four.erase("rope_parameters");
  EXPECT_EQ(model_config_from_json(four, "c.json"), m);
  // transformers 4's older spelling of the type.
  four["rope_scaling"].erase("rope_type");
  four["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(model_config_from_json(four, "c.json"), m);
}

TEST(Families, EveryRopeTypeRoundTrips) {
  for (RopeType type : {RopeType::default_rope, RopeType::linear, RopeType::dynamic, RopeType::yarn,
                        RopeType::llama3}) {
    for (ModelType family : {ModelType::mixtral, ModelType::qwen3_moe}) {
      ModelConfig m = family == ModelType::mixtral ? ModelConfig{} : qwen3();
      m.rope_type = type;
      if (type != RopeType::default_rope) m.rope_factor = 4;
      if (type == RopeType::llama3 || type == RopeType::yarn) {
        m.rope_original_max_position_embeddings = 128;
      }
      if (type == RopeType::llama3) {
        m.rope_low_freq_factor = 2;
        m.rope_high_freq_factor = 8;
      }
      SCOPED_TRACE(std::string(enum_name(family)) + " " + std::string(enum_name(type)));
      EXPECT_EQ(model_config_from_json(model_config_json(m), "c.json"), m);
    }
  }
}

TEST(Families, ConfigJsonErrorsNameTheField) {
  const nlohmann::json good = model_config_json(yarn_qwen3());
  auto error_with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[field] = value;
    return error_of([&] { model_config_from_json(j, "hub/config.json"); });
  };
  EXPECT_CONTAINS(error_with("model_type", "gpt_neox"),
                  "hub/config.json: field \"model_type\" is \"gpt_neox\"; moepeak trains the "
                  "families \"mixtral\", \"qwen3_moe\", \"gpt_oss\"");
  EXPECT_CONTAINS(error_with("use_sliding_window", true),
                  "hub/config.json: field \"use_sliding_window\" is true");
  EXPECT_CONTAINS(error_with("attention_bias", 1), "hub/config.json: field \"attention_bias\"");
  EXPECT_CONTAINS(error_with("mlp_only_layers", nlohmann::json::array({7})),
                  "field \"mlp_only_layers\" holds 7");
  EXPECT_CONTAINS(error_with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 2.0}}),
                  "field \"rope_scaling.rope_type\" is \"longrope\"");
  {  // transformers reads a non-empty rope_scaling over rope_parameters.
    nlohmann::json j = good;
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
    const ModelConfig m = model_config_from_json(j, "c.json");
    EXPECT_EQ(m.rope_type, RopeType::linear);
    EXPECT_EQ(m.rope_factor, 2.0);
  }
  // rope_parameters alone (transformers 5's form) is read as strictly.
  auto params_error = [&](const nlohmann::json& params) {
    nlohmann::json j = good;
    j.erase("rope_scaling");
    j["rope_parameters"] = params;
    return error_of([&] { model_config_from_json(j, "hub/config.json"); });
  };
  EXPECT_CONTAINS(params_error({{"rope_type", "linear"}, {"rope_theta", 1e6}, {"x", 1}}),
                  "field \"rope_parameters.x\" is not a RoPE parameter");
  EXPECT_CONTAINS(params_error({{"rope_type", "linear"}, {"rope_theta", 1e6}}),
                  "field \"rope_parameters.factor\" is missing");
  nlohmann::json missing = good;
  missing.erase("num_experts");
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(missing, "hub/config.json"); }),
                  "hub/config.json: field \"num_experts\" is missing");
}

}  // namespace
}  // namespace moepeak
