// The deepseek_v3 family (core/model/families/deepseek_v3.cpp): its description of the decoder
// (latent attention, the softmax scale, sigmoid group routing, shared experts, dense first
// layers), its Hub names, its config.json both ways (Kimi-K2's "kimi_k2" included), the settings
// it refuses, and the presets' parameter counts against the published totals.
// Run: ctest -R test_family_deepseek_v3
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/checkpoint/hf_config.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/model/decoder_spec.h"
#include "core/model/families/family.h"
#include "core/model/param_layout.h"
#include "tests/expect_contains.h"
#include "tests/model/hf_deepseek_fixture.h"
#include "tests/source_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

// The FP8 tests' small model (tests/model/hf_deepseek_fixture.h) with 3 layers and no MTP layer.
ModelConfig deepseek() {
  ModelConfig m = test_support::small_deepseek(/*mtp_layers=*/0);
  m.num_hidden_layers = 3;
  return m;
}

TEST(FamilyDeepseekV3, DescribesLatentAttentionGroupRoutingAndSharedExperts) {
  const DecoderSpec s = describe_decoder(deepseek());
  ASSERT_EQ(s.layers.size(), 3u);
  const AttentionSpec& a = s.layers[0].attention;
  EXPECT_TRUE(a.latent());
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.kv_heads, 4);
  EXPECT_EQ(a.head_dim, 12);
  EXPECT_EQ(a.value_dim(), 6);
  EXPECT_EQ(a.rope_dim, 4);
  EXPECT_EQ(a.q_lora_rank, 16);
  EXPECT_EQ(a.kv_lora_rank, 12);
  EXPECT_EQ(a.latent_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(12.0));  // no YaRN: qk_head_dim^-0.5
  EXPECT_EQ(s.rope.rotary_dim, 4);
  EXPECT_TRUE(s.rope.interleaved);
  EXPECT_FALSE(s.layers[0].mlp.moe());  // first_k_dense_replace = 1
  EXPECT_EQ(s.layers[0].mlp.intermediate, 40);
  const MlpSpec& mlp = s.layers[1].mlp;
  EXPECT_TRUE(mlp.moe());
  EXPECT_EQ(mlp.intermediate, 12);
  EXPECT_EQ(mlp.shared_intermediate, 24);  // 2 shared experts of 12
  EXPECT_EQ(mlp.router.score, RouterScore::sigmoid_group_limited);
  EXPECT_EQ(mlp.router.groups, 4);
  EXPECT_EQ(mlp.router.topk_groups, 2);
  EXPECT_EQ(mlp.router.scaling, 2.5);
  EXPECT_TRUE(mlp.router.correction_bias);
  EXPECT_FALSE(mlp.router.bias);
  // router_aux_loss_coef is the sequence-wise balance loss's alpha (0 = off).
  EXPECT_TRUE(s.aux_loss_per_sequence);
  EXPECT_EQ(s.aux_loss_coef, 0.0);
  ModelConfig with_loss = deepseek();
  with_loss.router_aux_loss_coef = 1e-4;
  EXPECT_EQ(describe_decoder(with_loss).aux_loss_coef, 1e-4);
}

// transformers' yarn_apply_mscale: qk_head_dim^-0.5 * (0.1 * mscale_all_dim * ln(factor) + 1)^2.
TEST(FamilyDeepseekV3, YarnScalesTheSoftmaxByTheSquaredMscale) {
  ModelConfig m = deepseek();
  m.rope_type = RopeType::yarn;
  m.rope_factor = 40;
  m.rope_original_max_position_embeddings = 64;
  m.max_position_embeddings = 2560;
  m.rope_mscale = 1.0;
  m.rope_mscale_all_dim = 0.7;
  const double f = 0.1 * 0.7 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(describe_decoder(m).layers[0].attention.scale, f * f / std::sqrt(12.0));
  m.rope_mscale_all_dim = 0;  // not set: the plain scale
  EXPECT_DOUBLE_EQ(describe_decoder(m).layers[0].attention.scale, 1.0 / std::sqrt(12.0));
}

TEST(FamilyDeepseekV3, ParamsAreTheHubTensors) {
  ModelConfig m = deepseek();
  const ParamLayout P(m);
  const LayerParamIndex& dense = P.layers[0];
  const LayerParamIndex& moe = P.layers[1];
  auto name = [&](int i) { return P.params()[i].name; };
  auto shape = [&](int i) { return P.params()[i].shape; };
  EXPECT_EQ(name(dense.q_a), "model.layers.0.self_attn.q_a_proj.weight");
  EXPECT_EQ(shape(dense.q_a), (Shape{16, 32}));
  EXPECT_EQ(name(dense.q_a_norm), "model.layers.0.self_attn.q_a_layernorm.weight");
  EXPECT_EQ(name(dense.q_b), "model.layers.0.self_attn.q_b_proj.weight");
  EXPECT_EQ(shape(dense.q_b), (Shape{4 * 12, 16}));
  EXPECT_EQ(dense.q, -1);
  EXPECT_EQ(dense.k, -1);
  EXPECT_EQ(dense.v, -1);
  EXPECT_EQ(name(dense.kv_a), "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(shape(dense.kv_a), (Shape{12 + 4, 32}));
  EXPECT_EQ(name(dense.kv_a_norm), "model.layers.0.self_attn.kv_a_layernorm.weight");
  EXPECT_EQ(shape(dense.kv_b), (Shape{4 * (8 + 6), 12}));
  EXPECT_EQ(shape(dense.o), (Shape{32, 4 * 6}));
  EXPECT_EQ(name(dense.dense_gate), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(name(moe.router), "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(name(moe.router_correction_bias), "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_TRUE(P.params()[moe.router_correction_bias].zero_init);
  EXPECT_FALSE(P.params()[moe.router_correction_bias].decays);
  EXPECT_EQ(name(moe.w1[3]), "model.layers.1.mlp.experts.3.gate_proj.weight");
  EXPECT_EQ(name(moe.w2[3]), "model.layers.1.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(name(moe.shared_gate), "model.layers.1.mlp.shared_experts.gate_proj.weight");
  EXPECT_EQ(shape(moe.shared_down), (Shape{32, 24}));
  // Without the query bottleneck: a plain q_proj of the layer input.
  m.q_lora_rank = 0;
  const ParamLayout plain(m);
  EXPECT_EQ(plain.params()[plain.layers[0].q].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(plain.params()[plain.layers[0].q].shape, (Shape{48, 32}));
  EXPECT_EQ(plain.layers[0].q_a, -1);
}

TEST(FamilyDeepseekV3, ConfigJsonBothWaysAndKimiK2) {
  ModelConfig m = deepseek();
  m.q_lora_rank = 0;  // written as null
  const nlohmann::json j = family_of(ModelType::deepseek_v3).to_hf_config(m, "bfloat16");
  EXPECT_EQ(j["model_type"], "deepseek_v3");
  EXPECT_EQ(j["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_TRUE(j["q_lora_rank"].is_null());
  EXPECT_EQ(j["head_dim"], 4);  // transformers' head_dim: the rotary part
  EXPECT_EQ(j["n_routed_experts"], 8);
  EXPECT_EQ(j["topk_method"], "noaux_tc");
  EXPECT_FALSE(j.contains("seq_aux"));
  EXPECT_EQ(model_config_from_json(j, "c.json"), m);
  // The sequence-wise loss under DeepSeek's own names; not read back (a training choice).
  ModelConfig with_loss = m;
  with_loss.router_aux_loss_coef = 1e-4;
  const nlohmann::json jl = family_of(ModelType::deepseek_v3).to_hf_config(with_loss, "bfloat16");
  EXPECT_EQ(jl["aux_loss_alpha"], 1e-4);
  EXPECT_EQ(jl["seq_aux"], true);
  EXPECT_EQ(model_config_from_json(jl, "c.json").router_aux_loss_coef, 0.0);
  // Kimi-K2's config.json says kimi_k2; the export says deepseek_v3.
  nlohmann::json kimi = j;
  kimi["model_type"] = "kimi_k2";
  EXPECT_EQ(model_config_from_json(kimi, "c.json"), m);
  // Absent fields take transformers' defaults; a missing num_key_value_heads is the heads.
  nlohmann::json sparse = j;
  for (const char* f : {"n_group", "topk_group", "routed_scaling_factor", "rope_interleave",
                        "num_key_value_heads", "head_dim"}) {
    sparse.erase(f);
  }
  const ModelConfig read = model_config_from_json(sparse, "c.json");
  EXPECT_EQ(read.n_group, 8);
  EXPECT_EQ(read.topk_group, 4);
  EXPECT_EQ(read.routed_scaling_factor, 2.5);
  EXPECT_TRUE(read.rope_interleave);
  EXPECT_EQ(read.num_key_value_heads, 4);
  EXPECT_EQ(read.head_dim, 12);
  nlohmann::json bad = j;
  bad["scoring_func"] = "softmax";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(bad, "hub/config.json"); }),
                  "hub/config.json: field \"scoring_func\"");
  bad = j;
  bad["topk_method"] = "greedy";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(bad, "hub/config.json"); }),
                  "hub/config.json: field \"topk_method\"");
  bad = j;
  bad.erase("kv_lora_rank");
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(bad, "hub/config.json"); }),
                  "kv_lora_rank");
}

TEST(FamilyDeepseekV3, RefusesWhatItCannotTake) {
  auto refused = [](ModelConfig m) { return error_of([&] { describe_decoder(m); }); };
  ModelConfig m = deepseek();
  m.num_key_value_heads = 2;
  EXPECT_CONTAINS(refused(m), "model.num_key_value_heads");
  m = deepseek();
  m.n_group = 3;  // 8 experts do not split into 3 groups
  EXPECT_CONTAINS(refused(m), "model.n_group");
  m = deepseek();
  m.topk_group = 1;  // 2 experts of 1 group of 2 is fine; 3 is not
  m.num_experts_per_tok = 3;
  EXPECT_CONTAINS(refused(m), "model.num_experts_per_tok");
  m = deepseek();
  m.qk_rope_head_dim = 3;
  m.head_dim = 11;
  EXPECT_CONTAINS(refused(m), "model.qk_rope_head_dim");
  m = deepseek();
  m.head_dim = 16;
  EXPECT_CONTAINS(refused(m), "model.head_dim");
  m = deepseek();
  m.mlp_only_layers = {0};
  EXPECT_CONTAINS(refused(m), "model.mlp_only_layers");
  m = deepseek();
  m.attention_bias = true;
  EXPECT_CONTAINS(refused(m), "model.attention_bias");
  // And the other families refuse deepseek_v3's keys.
  ModelConfig mixtral;
  mixtral.kv_lora_rank = 8;
  EXPECT_CONTAINS(refused(mixtral), "model.kv_lora_rank is set, but the mixtral family");
  mixtral = ModelConfig();
  mixtral.router_bias_update_rate = 1e-3;
  EXPECT_CONTAINS(refused(mixtral), "model.router_bias_update_rate");
}

// The presets are the released models. DeepSeek-V3: 671B parameters without its 14B
// multi-token-prediction layer, 37B active (the paper, arXiv 2412.19437); Kimi-K2: "1T"
// parameters, 32B active (its model card). Counted by hand from the config: DeepSeek-V3 61 x
// 187,121,664 (latent attention and norms) + 3 x 396,361,728 (dense) + 58 x 11,320,164,608
// (router, bias, 256 experts, shared) + 2 x 129,280 x 7168 + 7168; Kimi-K2 61 x 101,138,432 +
// 396,361,728 + 60 x 16,958,226,816 + 2 x 163,840 x 7168 + 7168.
TEST(FamilyDeepseekV3, PresetsHaveThePublishedParameterCounts) {
  struct Preset {
    const char* name;
    int64_t total;
    double active_billions;
  };
  for (const Preset& p :
       {Preset{"deepseek-v3", 671'026'419'200, 37.0}, Preset{"kimi-k2", 1'026'408'232'448, 32.0}}) {
    SCOPED_TRACE(p.name);
    const Config cfg =
        load_config({test_support::source_dir() + "/configs/" + p.name + ".toml"}, {});
    const ParamLayout P(cfg.model);
    EXPECT_EQ(P.parameter_count(), p.total);
    // The published active counts include the embedding; active_matmul_parameters does not.
    EXPECT_NEAR(static_cast<double>(P.active_matmul_parameters()) / 1e9, p.active_billions, 1.0);
    EXPECT_TRUE(P.spec().any_latent());
    EXPECT_TRUE(P.spec().any_shared_experts());
  }
}

}  // namespace
}  // namespace moepeak
