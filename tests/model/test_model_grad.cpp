// The whole decoder in float64, Mixtral's and each family's parts (Qwen3-MoE's q/k norms, dense
// layers, top-k weights not renormalised, a tied head; gpt-oss; DeepSeek-V3 with and without its
// sequence-wise balance loss): loss and every parameter's gradient
// against central finite differences, gradient checkpointing ("standard") bitwise equal to
// keeping every activation ("none"), and bitwise determinism. Run: ctest -R test_model_grad
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/model/decoder.h"
#include "tests/ops/gradcheck.h"

namespace moepeak {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 11;
  m.hidden_size = 8;
  m.intermediate_size = 12;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 3;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 16;
  m.initializer_range = 0.5;  // large enough that routing is far from ties
  return m;
}

struct ModelHarness {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm = make_comm(*backend, RankInfo{});  // one rank
  int64_t B = 2, T = 6;
  OwnedTensor ids, labels, positions;
  int64_t scored = 0;

  ModelHarness() {
    const int64_t N = B * T;
    ids = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "ids");
    labels = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
    positions =
        OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
    for (int64_t n = 0; n < N; ++n) {
      ids.data_as<int64_t>()[n] = (n * 7 + 3) % 11;
      labels.data_as<int64_t>()[n] = n % 5 == 2 ? -100 : (n * 5 + 1) % 11;  // some not scored
      positions.data_as<int64_t>()[n] = n % T;
      scored += labels.data_as<int64_t>()[n] != -100;
    }
  }
  TokenBatch batch() const { return TokenBatch{ids, labels, positions, B, T, scored}; }
};

// The worst relative error between the analytic gradient and central finite differences over
// three elements (first, middle, last) of every parameter of `cfg`, "name[j] analytic .. numeric
// .." of the worst in `where`.
double worst_gradient_error(const ModelConfig& cfg, std::string& where) {
  ModelHarness h;
  DecoderModel model(*h.backend, h.stream, *h.comm, cfg, CheckpointSchedule::none, DType::f64);
  model.params().initialize(42, 0.5, h.stream);
  model.params().zero_grads(h.stream);
  const double loss = model.forward_backward(h.batch(), h.scored);
  EXPECT_GT(loss, 0.5);
  const ParamLayout& layout = model.params().layout();
  const ZeroParamStore& store = model.params();
  // NOTES: h = 1e-5 balances truncation (~h^2 = 1e-10 relative) against rounding (~1e-16 * loss / h
  // = 2e-11 absolute); errors are relative to max(|g|, 1e-3 * the largest gradient) so that
  // tiny gradients (1e-5 and below) are judged by absolute error instead of noise over noise.
  const double eps = 1e-5;
  double max_grad = 0;
  const Tensor flat_grads = store.flat_grads();
  for (int64_t i = 0; i < flat_grads.numel(); ++i) {
    max_grad = std::max(max_grad, std::abs(flat_grads.data_as<double>()[i]));
  }
  double worst = 0;
  for (size_t index = 0; index < layout.params().size(); ++index) {
    const ParamInfo& p = layout.params()[index];
    double* values = store.local_value(static_cast<int>(index)).data_as<double>();
    const double* grads = store.local_grad(static_cast<int>(index)).data_as<double>();
    // Three elements of every tensor: first, middle, last.
    for (int64_t j : {int64_t{0}, p.shape.numel() / 2, p.shape.numel() - 1}) {
      double& x = values[j];
      const double saved = x;
      x = saved + eps;
      const double up = model.forward_loss(h.batch(), h.scored);
      x = saved - eps;
      const double down = model.forward_loss(h.batch(), h.scored);
      x = saved;
      const double numeric = (up - down) / (2 * eps);
      const double err = testing::rel_err(grads[j], numeric, 1e-3 * max_grad);
      if (err > worst) {
        worst = err;
        where = p.name + "[" + std::to_string(j) + "] analytic " + std::to_string(grads[j]) +
                " numeric " + std::to_string(numeric);
      }
    }
  }
  return worst;
}

class ModelGradAux : public ::testing::TestWithParam<double> {};  // router_aux_loss_coef

TEST_P(ModelGradAux, EveryParameterMatchesFiniteDifferences) {
  ModelConfig cfg = small_model();
  cfg.router_aux_loss_coef = GetParam();
  std::string worst_name;
  const double worst = worst_gradient_error(cfg, worst_name);
  EXPECT_LT(worst, 1e-6) << "worst at " << worst_name;
}

// Without and with Mixtral's auxiliary load-balancing loss (a large coefficient so its gradient
// is not lost next to the cross-entropy's).
INSTANTIATE_TEST_SUITE_P(AuxLoss, ModelGradAux, ::testing::Values(0.0, 0.5));

// Qwen3-MoE's parts one at a time and together: the per-head q/k RMSNorm (always on for the
// family), a dense layer (mlp_only_layers, then decoder_sparse_step), the top-k weights not
// renormalised (transformers' default for qwen3_moe), a tied head, the aux loss over the MoE
// layers only, and an expert width apart from the dense one.
struct FamilyCase {
  const char* name;
  void (*edit)(ModelConfig&);
};

ModelConfig qwen3_model() {
  ModelConfig m = small_model();
  m.model_type = ModelType::qwen3_moe;
  m.moe_intermediate_size = 6;
  m.rms_norm_eps = 1e-2;  // so that the q/k norms' eps visibly matters
  return m;
}

void to_deepseek(ModelConfig& m, int64_t q_lora_rank, int64_t dense_layers, double aux_coef) {
  m.model_type = ModelType::deepseek_v3;
  m.num_key_value_heads = m.num_attention_heads;
  m.q_lora_rank = q_lora_rank;
  m.kv_lora_rank = 5;
  m.qk_nope_head_dim = 2;
  m.qk_rope_head_dim = 2;
  m.v_head_dim = 3;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.n_group = 2;
  m.topk_group = 1;
  m.routed_scaling_factor = 1.7;
  m.n_shared_experts = 1;
  m.first_k_dense_replace = dense_layers;
  m.router_aux_loss_coef = aux_coef;
}

const FamilyCase kFamilyCases[] = {
    {"Qwen3QkNorm", [](ModelConfig&) {}},
    {"Qwen3DenseFirstLayer", [](ModelConfig& m) { m.mlp_only_layers = {0}; }},
    {"Qwen3SparseStep2", [](ModelConfig& m) { m.decoder_sparse_step = 2; }},
    {"Qwen3TopkNotRenormalised", [](ModelConfig& m) { m.norm_topk_prob = false; }},
    {"Qwen3TiedHead", [](ModelConfig& m) { m.tie_word_embeddings = true; }},
    {"Qwen3AttentionBias", [](ModelConfig& m) { m.attention_bias = true; }},
    {"Qwen3AuxLossDenseFirst",
     [](ModelConfig& m) {
       m.router_aux_loss_coef = 0.5;
       m.mlp_only_layers = {0};
       m.norm_topk_prob = false;
     }},
    // gpt-oss: q/k/v/o biases, sinks, layer 0 sliding (window 3 of T) and layer 1 full, the
    // router's bias and top-k-then-softmax, expert biases and a clamp that binds (limit 0.3).
    {"GptOss",
     [](ModelConfig& m) {
       m.model_type = ModelType::gpt_oss;
       m.moe_intermediate_size = 0;
       m.attention_bias = true;
       m.sliding_window = 3;
       m.swiglu_limit = 0.3;
     }},
    {"GptOssWindowOneAuxLoss",
     [](ModelConfig& m) {
       m.model_type = ModelType::gpt_oss;
       m.moe_intermediate_size = 0;
       m.attention_bias = true;
       m.sliding_window = 1;
       m.swiglu_limit = 0.3;
       m.router_aux_loss_coef = 0.5;
     }},
    // DeepSeek-V3: latent attention (a plain q_proj, then the q bottleneck), interleaved RoPE,
    // sigmoid group-limited routing (2 groups of 2, one kept) with scaled weights, shared
    // experts, a dense first layer; then every layer MoE with the sequence-wise balance loss
    // (alpha 0.5, large enough to be seen beside the cross-entropy).
    {"DeepseekV3", [](ModelConfig& m) { to_deepseek(m, 0, 1, 0.0); }},
    {"DeepseekV3SequenceAuxLoss", [](ModelConfig& m) { to_deepseek(m, 6, 0, 0.5); }},
    {"MixtralTiedHead",
     [](ModelConfig& m) {
       m.model_type = ModelType::mixtral;
       m.moe_intermediate_size = 0;
       m.tie_word_embeddings = true;
     }},
};

class ModelGradFamily : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(ModelGradFamily, EveryParameterMatchesFiniteDifferences) {
  ModelConfig cfg = qwen3_model();
  GetParam().edit(cfg);
  std::string worst_name;
  const double worst = worst_gradient_error(cfg, worst_name);
  EXPECT_LT(worst, 1e-6) << "worst at " << worst_name;
}

INSTANTIATE_TEST_SUITE_P(Families, ModelGradFamily, ::testing::ValuesIn(kFamilyCases),
                         [](const ::testing::TestParamInfo<FamilyCase>& info) {
                           return std::string(info.param.name);
                         });

// The loss and the flat gradients' bytes of one step of `cfg` (f64) without checkpointing
// ([0]) and with it ([1]).
struct CheckpointRuns {
  std::vector<double> loss = std::vector<double>(2);
  std::vector<std::vector<char>> grads = std::vector<std::vector<char>>(2);
};

CheckpointRuns without_and_with_checkpointing(const ModelConfig& cfg) {
  ModelHarness h;
  CheckpointRuns r;
  int i = 0;
  for (CheckpointSchedule c : {CheckpointSchedule::none, CheckpointSchedule::standard}) {
    DecoderModel model(*h.backend, h.stream, *h.comm, cfg, c, DType::f64);
    model.params().initialize(7, 0.5, h.stream);
    model.params().zero_grads(h.stream);
    r.loss[i] = model.forward_backward(h.batch(), h.scored);
    Tensor g = model.params().flat_grads();
    r.grads[i].assign(static_cast<char*>(g.data()), static_cast<char*>(g.data()) + g.nbytes());
    ++i;
  }
  return r;
}

TEST(ModelGrad, CheckpointingIsBitwiseEqualToKeepingActivations) {
  const CheckpointRuns r = without_and_with_checkpointing(small_model());
  const auto& loss = r.loss;
  const auto& grads = r.grads;
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// The same for Qwen3-MoE with a dense layer and unnormalised top-k weights: the recompute of a
// dense layer keeps only its gate and up projections, a MoE layer's only its routing.
TEST(ModelGrad, Qwen3CheckpointingIsBitwiseEqualToKeepingActivations) {
  ModelConfig cfg = qwen3_model();
  cfg.mlp_only_layers = {1};
  cfg.norm_topk_prob = false;
  const CheckpointRuns r = without_and_with_checkpointing(cfg);
  EXPECT_EQ(r.loss[0], r.loss[1]);
  EXPECT_EQ(r.grads[0], r.grads[1]);
}

TEST(ModelGrad, BoundariesLiveSetIsOneTensorPerLayerUnderCheckpointing) {
  ModelHarness h;
  ModelConfig cfg = small_model();
  DecoderModel model(*h.backend, h.stream, *h.comm, cfg, CheckpointSchedule::standard, DType::f32);
  model.params().initialize(7, 0.5, h.stream);
  h.backend->arena().reset_peaks();
  model.forward_backward(h.batch(), h.scored);
  // Layer inputs 0..L-1 plus the final hidden state, each (N, H) f32, at most one extra layer
  // output alive while a layer is recomputed.
  const uint64_t one =
      DeviceArena::footprint(static_cast<uint64_t>(h.B * h.T * cfg.hidden_size) * 4);
  const uint64_t peak = h.backend->arena().stats().peak_per_set()[LiveSet::boundaries];
  EXPECT_GE(peak, (cfg.num_hidden_layers + 1) * one);
  EXPECT_LE(peak, (cfg.num_hidden_layers + 2) * one);
}

}  // namespace
}  // namespace moepeak
