// The standard schedules' live sets, measured in the arena during a real step, against the
// closed-form bytes the planner uses (ops/schedules/*_bytes), and the model's own `attention` and
// `workspace` against core/model/decoder_memory.h's functions phase by phase: equal, not merely
// under, since the formulas describe exactly what each schedule and the decoder allocate.
// Run: ctest -R test_model_memory
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "core/model/decoder.h"
#include "core/model/decoder_memory.h"
#include "core/model/optimizer_params.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/checkpoint_standard.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/schedule_dtype.h"
#include "ops/schedules/vocab_materialized.h"

namespace moepeak {
namespace {

ModelConfig model_config() {
  ModelConfig m;
  m.vocab_size = 96;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  return m;
}

// The same as a Qwen3-MoE: q/k norms, a dense layer, experts narrower than the dense width,
// head_dim apart from H / nh, a tied head.
ModelConfig qwen3_config() {
  ModelConfig m = model_config();
  m.model_type = ModelType::qwen3_moe;
  m.moe_intermediate_size = 24;
  m.mlp_only_layers = {1};
  m.head_dim = 12;
  m.tie_word_embeddings = true;
  return m;
}

// The same as a DeepSeek-V3: latent attention (q/k heads of 8 + 4, value heads of 6), dense
// first layers, MoE layers with sigmoid group-limited routing (its correction bias widened to fp32
// in bf16) and shared experts of twice the experts' 12. The variants' widths make a different
// moment of the decoder the largest of its phase in each, so that each term of the functions is
// held to a measured peak somewhere:
struct DeepseekVariant {
  const char* name;
  int64_t hidden, q_lora_rank, kv_lora_rank, shared_experts, dense_layers;
  int64_t experts = 8;
  double sequence_aux = 0;  // router_aux_loss_coef: the sequence-wise balance loss
};
const DeepseekVariant kDeepseekVariants[] = {
    // dk's and dv's token layout beside the rotary key's gradient and d kv_b; the shared
    // experts' SwiGLU (forward) and its gradients (backward).
    {"bottleneck", 32, 16, 20, 2, 1},
    {"plain_q", 32, 0, 20, 2, 1},
    // A latent wider than kv_b's output: the kv_a output (forward), d kv_a (backward).
    {"wide_kv_latent", 32, 16, 96, 2, 1},
    // A query bottleneck wider than q: d q latent beside dq in Hub order and dn1.
    {"wide_q_latent", 96, 80, 20, 2, 1},
    // dq in Hub order beside dq and dn1.
    {"plain_q_wide_hidden", 90, 0, 20, 2, 1},
    // A latent wider than q, a hidden wider than the latent: d kv_a beside dq and dn1.
    {"wide_kv_latent_wide_hidden", 80, 0, 56, 2, 1},
    // Routed experts only: the router logits beside the fp32 correction bias (bf16).
    {"routed_only", 32, 16, 20, 0, 0},
    // Many experts and the sequence-wise balance loss: its per-sequence gradient beside the
    // router logits' gradient (backward).
    {"sequence_aux", 32, 16, 20, 0, 0, 64, 0.1},
};

ModelConfig deepseek_v3_config(const DeepseekVariant& v) {
  ModelConfig m = model_config();
  m.model_type = ModelType::deepseek_v3;
  m.hidden_size = v.hidden;
  m.intermediate_size = 40;
  m.moe_intermediate_size = 12;
  m.num_key_value_heads = 4;
  m.q_lora_rank = v.q_lora_rank;
  m.kv_lora_rank = v.kv_lora_rank;
  m.qk_nope_head_dim = 8;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 6;
  m.head_dim = 12;
  m.num_local_experts = v.experts;
  m.router_aux_loss_coef = v.sequence_aux;
  m.n_group = 4;
  m.topk_group = 2;
  m.routed_scaling_factor = 2.5;
  m.n_shared_experts = v.shared_experts;
  m.first_k_dense_replace = v.dense_layers;
  m.rope_interleave = true;
  return m;
}

// One step of `cfg` under `checkpoint` in `dtype`: each standard schedule's set at its formula,
// and per phase of the step (the optimizer's aside: no optimizer step runs here) the model's
// attention and workspace at attention_phase_bytes / workspace_phase_bytes.
void expect_standard_live_sets(const ModelConfig& cfg, CheckpointSchedule checkpoint, DType dtype) {
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  const int64_t B = 3, T = 20, N = B * T;
  auto ids = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "ids");
  auto labels = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
  auto positions =
      OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
  for (int64_t n = 0; n < N; ++n) {
    ids.data_as<int64_t>()[n] = (n * 13 + 5) % cfg.vocab_size;
    labels.data_as<int64_t>()[n] = (n * 7 + 1) % cfg.vocab_size;
    positions.data_as<int64_t>()[n] = n % T;
  }
  auto comm = make_comm(*backend, RankInfo{});  // one rank
  DecoderModel model(*backend, stream, *comm, cfg, checkpoint, dtype);
  model.params().initialize(3, 0.1, stream);
  schedules::ResidentAdamW adamw(*backend, optimizer_params(model.params()), OptimizerConfig{});
  backend->arena().reset_peaks();
  model.forward_backward(TokenBatch{ids, labels, positions, B, T, N}, N);
  const MemoryStats s = backend->arena().stats();
  const uint64_t b = dtype_size(dtype);
  const int64_t params = model.params().layout().total_elements();

  // The MoE layers' dispatch (every layer's for Mixtral) at the experts' width.
  const int64_t layers_resident =
      checkpoint == CheckpointSchedule::none ? model.spec().moe_layers() : 1;
  EXPECT_EQ(
      s.peak_per_set()[LiveSet::dispatch],
      schedules::dispatch_standard_bytes(N, cfg.num_experts_per_tok, cfg.hidden_size,
                                         cfg.expert_intermediate_size(), dtype, layers_resident));
  EXPECT_EQ(s.peak_per_set()[LiveSet::logits],
            schedules::vocab_materialized_bytes(N, cfg.vocab_size, dtype));
  EXPECT_EQ(s.peak_per_set()[LiveSet::boundaries],
            schedules::boundaries_standard_bytes(cfg.num_hidden_layers, N, cfg.hidden_size, dtype));
  EXPECT_EQ(s.peak_per_set()[LiveSet::optimizer], schedules::adamw_resident_bytes(params, dtype));
  EXPECT_EQ(s.peak_per_set()[LiveSet::weights], DeviceArena::footprint(params * b));
  // The gradients are fp32 main grads beside bf16 weights (schedules::main_grad_dtype).
  EXPECT_EQ(s.peak_per_set()[LiveSet::grads],
            DeviceArena::footprint(params * dtype_size(schedules::main_grad_dtype(dtype))));
  // The total peak is one moment's sum of live sets, never more than their own peaks added up.
  const PhaseBytes attention =
      attention_phase_bytes(cfg, B, T, ParallelDegrees::uniform(1), checkpoint, dtype);
  SchedulesConfig schedules;
  schedules.checkpoint = checkpoint;
  // The batch's ids, labels and positions above are the trainer's, which the function counts.
  const PhaseBytes workspace =
      workspace_phase_bytes(cfg, B, T, ParallelDegrees::uniform(1), schedules, dtype);
  for (StepPhase ph : kAllStepPhases) {
    if (ph == StepPhase::optimizer) continue;
    EXPECT_EQ(s.phase_peak_per_set(ph)[LiveSet::attention], attention[ph]) << step_phase_name(ph);
    EXPECT_EQ(s.phase_peak_per_set(ph)[LiveSet::workspace], workspace[ph]) << step_phase_name(ph);
  }
  EXPECT_EQ(s.peak_per_set()[LiveSet::attention], attention.max());
  EXPECT_LE(s.peak_total(), s.peak_per_set().total());
  EXPECT_EQ(s.at_peak().total(), s.peak_total());
}

// (checkpointing, storage dtype): f32, and bf16 with the GPU path's byte layout (b = 2; on the
// CPU too, ops/cpu/cpu_storage.h), its AdamW keeping an fp32 master.
using LiveSetsCase = std::tuple<CheckpointSchedule, DType>;
class StandardLiveSets : public ::testing::TestWithParam<LiveSetsCase> {};
class Qwen3StandardLiveSets : public ::testing::TestWithParam<LiveSetsCase> {};
class DeepseekV3StandardLiveSets : public ::testing::TestWithParam<LiveSetsCase> {};

TEST_P(StandardLiveSets, MeasuredPeaksEqualThePlannedBytes) {
  const auto [checkpoint, dtype] = GetParam();
  expect_standard_live_sets(model_config(), checkpoint, dtype);
}

TEST_P(Qwen3StandardLiveSets, MeasuredPeaksEqualThePlannedBytes) {
  const auto [checkpoint, dtype] = GetParam();
  expect_standard_live_sets(qwen3_config(), checkpoint, dtype);
}

TEST_P(DeepseekV3StandardLiveSets, MeasuredPeaksEqualThePlannedBytes) {
  const auto [checkpoint, dtype] = GetParam();
  for (const DeepseekVariant& v : kDeepseekVariants) {
    SCOPED_TRACE(v.name);
    expect_standard_live_sets(deepseek_v3_config(v), checkpoint, dtype);
  }
}

std::string case_name(const ::testing::TestParamInfo<LiveSetsCase>& info) {
  return std::string(std::get<0>(info.param) == CheckpointSchedule::none ? "none" : "standard") +
         "_" + std::string(dtype_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, Qwen3StandardLiveSets,
                         ::testing::Combine(::testing::Values(CheckpointSchedule::none,
                                                              CheckpointSchedule::standard),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         case_name);

INSTANTIATE_TEST_SUITE_P(Checkpointing, DeepseekV3StandardLiveSets,
                         ::testing::Combine(::testing::Values(CheckpointSchedule::none,
                                                              CheckpointSchedule::standard),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         case_name);

INSTANTIATE_TEST_SUITE_P(Checkpointing, StandardLiveSets,
                         ::testing::Combine(::testing::Values(CheckpointSchedule::none,
                                                              CheckpointSchedule::standard),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         case_name);

}  // namespace
}  // namespace moepeak
