// The memory plan (core/plan/plan.h) on one rank: real training steps on the CPU backend under
// several schedule combinations, every live set's measured peak at or under its planned bytes and
// within 10% of them (plan_check.h); the verdict naming the overflowing terms and by how much; the
// max-context / max-batch search; bad configs rejected with their numbers.
// Run: ctest -R 'test_plan$' --output-on-failure
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>

#include "core/error.h"
#include "core/model/checkpoint_snapshot.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/vocab_choice.h"
#include "tests/expect_contains.h"
#include "tests/plan/plan_check.h"

namespace moepeak {
namespace {

using test_support::deepseek_v3_parts;
using test_support::expect_within_plan;
using test_support::tiny_plan_config;

// The statement throws moepeak::Error whose message contains `needle`.
#define EXPECT_THROW_CONTAINS(statement, needle)      \
  do {                                                \
    try {                                             \
      (void)(statement);                              \
      ADD_FAILURE() << #statement " did not throw";   \
    } catch (const Error& e) {                        \
      EXPECT_CONTAINS(std::string(e.what()), needle); \
    }                                                 \
  } while (0)

// The tiny config as a Qwen3-MoE: experts narrower than the dense width, head_dim apart from
// H / nh, top-k weights not renormalised.
void qwen3_parts(Config& c) {
  c.model.model_type = ModelType::qwen3_moe;
  c.model.moe_intermediate_size = 24;
  c.model.head_dim = 12;
  c.model.norm_topk_prob = false;
}

// The schedule combinations measured against the plan, each applied to the tiny config.
struct MeasuredCase {
  const char* name;
  void (*apply)(Config&);
};
void PrintTo(const MeasuredCase& c, std::ostream* os) { *os << c.name; }
const MeasuredCase kMeasuredCases[] = {
    {"standard", [](Config&) {}},
    {"none", [](Config& c) { c.schedules.checkpoint = CheckpointSchedule::none; }},
    {"sco_ring_dtp_offload_stream",
     [](Config& c) {
       c.schedules.checkpoint = CheckpointSchedule::sco;
       c.schedules.vocab = VocabSchedule::ring_dtp;
       c.schedules.vocab_strip = 16;
       c.schedules.vocab_kept_strips = 2;  // 2 of the strips go from forward to backward
       c.optimizer.placement = OptimizerPlacement::offload_stream;
     }},
    {"pipelined_llep_sco_offload_serial_aux",
     [](Config& c) {
       c.schedules.dispatch = DispatchSchedule::pipelined_llep;
       c.schedules.chunk_tokens = 24;
       c.schedules.checkpoint = CheckpointSchedule::sco;
       c.schedules.sco_host_budget = "2MiB";  // one 2 MiB pinned block: every layer fits in it
       // bf16: with the serial offload's pinned bf16 weight copy
       c.optimizer.placement = OptimizerPlacement::offload_serial;
       c.model.router_aux_loss_coef = 0.01;
     }},
    {"llep_none_ring_dtp",
     [](Config& c) {
       c.schedules.dispatch = DispatchSchedule::llep;
       c.schedules.checkpoint = CheckpointSchedule::none;
       c.schedules.vocab = VocabSchedule::ring_dtp;
     }},
    // Qwen3-MoE's parts: the q/k norms' kept activations, a dense layer's MLP, narrower experts,
    // head_dim != H / nh, a tied head; under each checkpoint schedule.
    {"qwen3_dense_tied",
     [](Config& c) {
       qwen3_parts(c);
       c.model.mlp_only_layers = {0};
       c.model.tie_word_embeddings = true;
     }},
    {"qwen3_none_sparse_step_aux",
     [](Config& c) {
       qwen3_parts(c);
       c.model.decoder_sparse_step = 2;
       c.model.router_aux_loss_coef = 0.01;
       c.schedules.checkpoint = CheckpointSchedule::none;
     }},
    {"qwen3_pipelined_llep_sco_ring_dtp",
     [](Config& c) {
       qwen3_parts(c);
       c.model.mlp_only_layers = {2};
       c.schedules.dispatch = DispatchSchedule::pipelined_llep;
       c.schedules.chunk_tokens = 24;
       c.schedules.checkpoint = CheckpointSchedule::sco;
       c.schedules.vocab = VocabSchedule::ring_dtp;
       c.optimizer.placement = OptimizerPlacement::offload_stream;
     }},
    // Packed documents: the sequences' document starts (B, T) i32 beside the batch's tokens
    // (the copy task's windows cut at token 3), with SCO recomputing the masked attention.
    {"documents_sco",
     [](Config& c) {
       c.training.document_mask = true;
       c.training.reset_position_ids = true;
       c.model.eos_token_id = 3;
       c.schedules.checkpoint = CheckpointSchedule::sco;
     }},
    // DeepSeek-V3's parts: the latent attention's kept latents and temporaries, a dense first
    // layer, shared experts beside the routed ones; under each checkpoint schedule, the query
    // bottleneck and the plain q projection.
    {"deepseek_v3_standard", deepseek_v3_parts},
    {"deepseek_v3_none_plain_q_aux",
     [](Config& c) {
       deepseek_v3_parts(c);
       c.model.q_lora_rank = 0;
       c.model.router_aux_loss_coef = 0.01;
       c.schedules.checkpoint = CheckpointSchedule::none;
     }},
    {"deepseek_v3_pipelined_llep_sco_ring_dtp",
     [](Config& c) {
       deepseek_v3_parts(c);
       c.model.first_k_dense_replace = 2;
       c.schedules.dispatch = DispatchSchedule::pipelined_llep;
       c.schedules.chunk_tokens = 24;
       c.schedules.checkpoint = CheckpointSchedule::sco;
       c.schedules.vocab = VocabSchedule::ring_dtp;
       c.optimizer.placement = OptimizerPlacement::offload_stream;
     }},
};

// Each case in float32 and in bfloat16 (training.dtype = "bfloat16" on the CPU: the GPU path's
// byte layout, b = 2, fp32 main gradients and AdamW's fp32 master): every live set's peak at or
// under its plan, within 10%.
class PlanMeasured : public testing::TestWithParam<std::tuple<MeasuredCase, ComputeDtype>> {};

TEST_P(PlanMeasured, EveryLiveSetAtOrUnderItsTerm) {
  const auto& [measured, dtype] = GetParam();
  Config c = tiny_plan_config();
  c.training.dtype = dtype;
  measured.apply(c);
  expect_within_plan(std::string(dtype == ComputeDtype::bfloat16 ? "bf16 " : "") + measured.name,
                     c);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PlanMeasured,
    testing::Combine(testing::ValuesIn(kMeasuredCases),
                     testing::Values(ComputeDtype::float32, ComputeDtype::bfloat16)),
    [](const testing::TestParamInfo<std::tuple<MeasuredCase, ComputeDtype>>& info) {
      return std::string(std::get<0>(info.param).name) + "_" +
             std::string(enum_name(std::get<1>(info.param)));
    });

// LLEP's spill copies (ops/schedules/llep_experts.h): min(E - E/W, plans * min(capacity, H))
// copies of 3 F H elements each (3 F H + 2 F + H with expert biases; arena footprint), H the
// helped-expert limit (E/W + 1 unless raised), the same again in backward, one scratch; none on
// one rank or when lambda > W (no plan can spill); the plan adds them to weights and grads.
TEST(PlanLlepSpill, CopyBoundArithmetic) {
  using schedules::llep_max_copies;
  using schedules::llep_spill_copy_bytes;
  const schedules::LlepParams lp{1.0, 1.0, 1};         // H = E/W + 1 (or E - E/W)
  const schedules::LlepParams open{1.0, 1.0, 1, 100};  // H = E - E/W
  EXPECT_EQ(llep_max_copies(8, 2, 1000, 1, lp), 4);    // E - E/W = 4 < E/W + 1
  EXPECT_EQ(llep_max_copies(8, 4, 1000, 1, lp), 3);    // H = E/W + 1 = 3
  EXPECT_EQ(llep_max_copies(8, 4, 1000, 1, open), 6);  // E - E/W
  EXPECT_EQ(llep_max_copies(8, 4, 1000, 2, lp), 6);    // K plans: K x H, at most E - E/W
  EXPECT_EQ(llep_max_copies(16, 4, 1000, 2, lp), 10);  // 2 x (E/W + 1) < 12
  EXPECT_EQ(llep_max_copies(8, 4, 2, 1, open), 2);     // at most `capacity` rows on a rank
  EXPECT_EQ(llep_max_copies(8, 4, 2, 2, open), 4);     // K plans: K x capacity
  EXPECT_EQ(llep_max_copies(8, 4, schedules::kNoCapacity, 3, lp), 6);  // no overflow
  EXPECT_EQ(llep_max_copies(8, 4, 5, 0, lp), 0);                       // no chunks
  EXPECT_EQ(llep_max_copies(8, 1, 1000, 1, lp), 0);               // one rank: nothing is foreign
  EXPECT_EQ(llep_max_copies(8, 4, 1000, 1, {1.0, 4.001, 1}), 0);  // lambda > W: never spills
  EXPECT_EQ(llep_max_copies(8, 4, 1000, 1, {1.0, 4.0, 1}), 3);    // = W: rounding may tip it
  EXPECT_THROW(llep_max_copies(8, 4, 1000, 1, {1.0, 1.0, 1, 2}), Error);  // below E/W + 1
  const auto b = llep_spill_copy_bytes(8, 4, 32, 48, DType::f32, 1000, 1, open);
  const uint64_t one = DeviceArena::footprint(3 * 48 * 32 * 4);
  EXPECT_EQ(b.copies, 6);
  EXPECT_EQ(b.weights, 6 * one);
  EXPECT_EQ(b.grads, 6 * one);
  EXPECT_EQ(b.scratch, one);
  EXPECT_EQ(llep_spill_copy_bytes(8, 4, 32, 48, DType::f32, 1000, 1, lp).weights, 3 * one);
  // Experts with biases (gpt-oss): each copy (and gradient copy, and the scratch) also holds b1,
  // b3 (F) and b2 (H): 3 F H + 2 F + H elements.
  const auto biased = llep_spill_copy_bytes(8, 4, 32, 48, DType::f32, 1000, 1, open, true);
  const uint64_t one_biased = DeviceArena::footprint((3 * 48 * 32 + 2 * 48 + 32) * 4);
  EXPECT_GT(one_biased, one);
  EXPECT_EQ(biased.copies, 6);
  EXPECT_EQ(biased.weights, 6 * one_biased);
  EXPECT_EQ(biased.grads, 6 * one_biased);
  EXPECT_EQ(biased.scratch, one_biased);
  const auto none = llep_spill_copy_bytes(8, 4, 32, 48, DType::f32, 1000, 1, {1.0, 100.0, 1});
  EXPECT_EQ(none.weights + none.grads + none.scratch, 0u);

  Config c = tiny_plan_config();  // E = 4, H = 32, F = 48, B x T = 2 x 48, k = 2
  c.schedules.dispatch = DispatchSchedule::llep;
  c.schedules.llep_lambda = 1.0;
  c.schedules.checkpoint = CheckpointSchedule::none;
  const Plan with = make_plan(c, plan_inputs(c, 2));
  c.schedules.llep_lambda = 100.0;
  const Plan without = make_plan(c, plan_inputs(c, 2));
  const uint64_t tiny = DeviceArena::footprint(3 * 48 * 32 * 4);
  const uint64_t L = static_cast<uint64_t>(c.model.num_hidden_layers);
  EXPECT_EQ(with.term(LiveSet::weights).bytes, without.term(LiveSet::weights).bytes + L * 2 * tiny);
  EXPECT_EQ(with.term(LiveSet::grads).bytes,
            without.term(LiveSet::grads).bytes + L * 2 * tiny + tiny);
  EXPECT_CONTAINS(with.term(LiveSet::weights).function, "llep_spill_copy_bytes(");
  EXPECT_CONTAINS(with.term(LiveSet::grads).function, "copies=2");

  // On 4 ranks (E/W = 1) the key sets the copies: 2 by default (E/W + 1), 3 = E - E/W when
  // raised, and a value below E/W + 1 is refused by the plan, naming the key.
  c.schedules.llep_lambda = 1.0;
  c.schedules.llep_max_helped_experts = 0;
  const Plan least = make_plan(c, plan_inputs(c, 4));
  c.schedules.llep_max_helped_experts = 3;
  const Plan most = make_plan(c, plan_inputs(c, 4));
  EXPECT_CONTAINS(least.term(LiveSet::weights).function, "copies=2");
  EXPECT_EQ(most.term(LiveSet::weights).bytes, least.term(LiveSet::weights).bytes + L * tiny);
  c.schedules.llep_max_helped_experts = 1;
  try {
    make_plan(c, plan_inputs(c, 4));
    FAIL();
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.message(), "schedules.llep_max_helped_experts = 1");
  }
}

TEST(PlanVerdict, NamesTheOverflowingTermAndTheAmount) {
  Config c = tiny_plan_config();
  PlanInputs in = plan_inputs(c, 1);
  const Plan fits = make_plan(c, in);
  ASSERT_TRUE(fits.fits()) << fits.verdict();
  EXPECT_TRUE(fits.overflow().empty());
  EXPECT_EQ(fits.verdict().rfind("FITS", 0), 0u) << fits.verdict();

  // A capacity just under the total: the largest set of the peak phase is named with the
  // overflow amount.
  in.capacity = fits.total - 1000;
  const Plan over = make_plan(c, in);
  EXPECT_FALSE(over.fits());
  EXPECT_FALSE(over.device_fits);
  EXPECT_TRUE(over.host_fits);
  const auto names = over.overflow();
  ASSERT_EQ(names.size(), 1u);
  const PlanPhase& peak = over.phase(over.peak_phase);
  LiveSet largest = LiveSet::weights;
  for (LiveSet s : kAllLiveSets) {
    if (peak[s] > peak[largest]) largest = s;
  }
  EXPECT_CONTAINS(names[0], std::string(live_set_name(largest)));
  EXPECT_CONTAINS(over.verdict(), "DOES NOT FIT");
  EXPECT_CONTAINS(over.verdict(), "by 1000 B");

  // The logits alone past the capacity (N x V = 96 x 40000 f32, 14.6 MiB; weights 10 MiB): named
  // on their own, with the amount (the optimizer state offloaded, so that it is not a term too).
  c.model.vocab_size = 40000;
  c.optimizer.placement = OptimizerPlacement::offload_stream;
  in.capacity = 12ull << 20;
  const Plan logits = make_plan(c, in);
  ASSERT_FALSE(logits.fits());
  ASSERT_EQ(logits.overflow().size(), 1u) << logits.verdict();
  EXPECT_CONTAINS(logits.overflow()[0], "logits");
  EXPECT_CONTAINS(logits.overflow()[0], "> capacity 12.00 MiB by");

  // Host: the offloaded optimizer state past the pinned budget.
  Config h = tiny_plan_config();
  h.optimizer.placement = OptimizerPlacement::offload_stream;
  PlanInputs hin = plan_inputs(h, 1);
  hin.host_budget = 1 << 20;
  const Plan host = make_plan(h, hin);
  EXPECT_TRUE(host.device_fits);
  EXPECT_FALSE(host.host_fits);
  EXPECT_CONTAINS(host.verdict(), "host");
  EXPECT_CONTAINS(host.verdict(), "optimizer_state");
}

TEST(PlanInputsTest, WorldSizeCapacityAndBudgetFromTheConfig) {
  Config c = tiny_plan_config();
  EXPECT_EQ(plan_inputs(c).world(), 1);
  c.parallelism.world_size = 4;
  EXPECT_EQ(plan_inputs(c).world(), 4);
  EXPECT_EQ(plan_inputs(c, 2).world(), 2);
  EXPECT_EQ(plan_inputs(c).capacity, 256ull << 20);
  EXPECT_EQ(plan_inputs(c).host_budget, 64ull << 20);
  c.runtime.device_memory = "auto";
  EXPECT_EQ(plan_inputs(c).capacity, Backend::kCpuDefaultDeviceMemory);
  c.runtime.backend = BackendChoice::cuda;
  EXPECT_THROW_CONTAINS(plan_inputs(c), "runtime.device_memory");
}

// CUDA: the context, cuBLAS and NCCL beside the arena, from the function that sizes an "auto"
// arena; the CPU backend has none. The H200 run (docs/perf.md): 527 MiB at open and 567 MiB
// beside the arena after a step, one rank with every bounded schedule on.
TEST(PlanOutsideArena, CudaTermsBesideTheArenaNoneOnTheCpu) {
  Config c = tiny_plan_config();
  c.training.dtype = ComputeDtype::float32;  // "auto" would be bf16 on CUDA
  const Plan cpu = make_plan(c, plan_inputs(c, 1));
  EXPECT_TRUE(cpu.outside.empty());
  c.runtime.backend = BackendChoice::cuda;
  const Plan one = make_plan(c, plan_inputs(c, 1));
  ASSERT_EQ(one.outside.size(), 3u);
  EXPECT_EQ(one.communicators, 0);
  EXPECT_EQ(one.outside_total, kCudaContextBytes + kCublasWorkspaceBytes + kCublasStateBytes);
  EXPECT_GE(one.outside_total, 567ull << 20);  // the measured figure
  EXPECT_LE(static_cast<double>(one.outside_total), 1.10 * (567ull << 20));
  // The live sets and the capacity are the arena's, as before.
  EXPECT_EQ(one.total, cpu.total);
  // Four ranks, experts and ZeRO-3 shards over all of them, Ring-DTP and PipelinedLLEP: the
  // world, ZeRO-3's duplicate of the data-shard group (the expert and dense replicas are one
  // rank each: no communicator), Ring-DTP's duplicate and PipelinedLLEP's two lanes.
  c.schedules.vocab = VocabSchedule::ring_dtp;
  c.schedules.dispatch = DispatchSchedule::pipelined_llep;
  c.parallelism.expert_parallel = 4;
  c.parallelism.data_shard = 4;
  const Plan four = make_plan(c, plan_inputs(c, 4));
  EXPECT_EQ(four.communicators, 1 + 1 + 1 + 2);
  EXPECT_EQ(four.outside_total, one.outside_total + 5 * kNcclCommunicatorBytes);
}

TEST(PlanSearch, MaxContextAndBatchAreTheLargestThatFit) {
  Config c = tiny_plan_config();
  c.schedules.vocab = VocabSchedule::ring_dtp;
  c.schedules.vocab_strip = 16;
  c.schedules.checkpoint = CheckpointSchedule::sco;
  c.model.vocab_size = 4096;
  PlanInputs in = plan_inputs(c, 2);
  in.capacity = 24ull << 20;
  const int64_t T = max_seq_len(c, in);
  const int64_t Ts = max_seq_len(with_standard_schedules(c), in);
  ASSERT_GT(T, 0);
  EXPECT_EQ(T % 2, 0);
  EXPECT_GT(T, Ts);  // the bounded schedules reach further
  PlanInputs at = in;
  at.seq_len = T;
  EXPECT_TRUE(make_plan(c, at).fits());
  at.seq_len = T + 2;
  EXPECT_FALSE(make_plan(c, at).fits());
  const int64_t B = max_batch(c, in);
  ASSERT_GT(B, 0);
  at = in;
  at.batch = B;
  EXPECT_TRUE(make_plan(c, at).fits());
  at.batch = B + 1;
  EXPECT_FALSE(make_plan(c, at).fits());
}

TEST(PlanErrors, BadConfigsAreRejectedWithTheirNumbers) {
  Config c = tiny_plan_config();
  EXPECT_THROW_CONTAINS(make_plan(c, plan_inputs(c, 3)), "W = 3");  // 4 experts over 3 ranks
  c.training.seq_len = 0;
  EXPECT_THROW_CONTAINS(make_plan(c, plan_inputs(c, 1)), "training.seq_len");
}

}  // namespace
}  // namespace moepeak

namespace moepeak {
namespace {

// checkpoint.async pins a snapshot of every saved flat: the host term "checkpoint_snapshot",
// only with checkpoint.enable and async, sized by the saver's own function (the weights and m, v
// of this rank's P elements; a master too when the weights are bf16).
TEST(PlanTest, AnAsyncCheckpointAddsItsSnapshotToTheHostTerms) {
  Config c = tiny_plan_config();
  auto snapshot = [](const Plan& p) -> const HostTerm* {
    for (const HostTerm& h : p.host) {
      if (h.name == "checkpoint_snapshot") return &h;
    }
    return nullptr;
  };
  c.checkpoint.async = true;
  EXPECT_EQ(snapshot(make_plan(c, plan_inputs(c, 1))), nullptr) << "checkpoints are off";
  c.checkpoint.enable = true;
  const Plan p = make_plan(c, plan_inputs(c, 1));
  const HostTerm* term = snapshot(p);
  ASSERT_NE(term, nullptr);
  const int64_t P = zero_persistent_elements(c.model, plan_inputs(c, 1).degrees,
                                             schedules::lm_head_sharding(c.schedules.vocab));
  EXPECT_EQ(term->bytes, checkpoint_snapshot_bytes(P, {DType::f32, DType::f32, DType::f32}));
  EXPECT_GE(term->bytes, static_cast<uint64_t>(P) * 12);
  EXPECT_EQ(checkpoint_flat_dtypes(DType::bf16),
            (std::vector<DType>{DType::bf16, DType::f32, DType::f32, DType::f32}));
  c.checkpoint.async = false;
  EXPECT_EQ(snapshot(make_plan(c, plan_inputs(c, 1))), nullptr) << "synchronous saves pin nothing";
}

}  // namespace
}  // namespace moepeak
