// DeepSeek-V3's auxiliary-loss-free balancing (core/train/router_balance.h) on W real rank
// processes, each holding its ZeRO-3 shard of every layer's e_score_correction_bias: three
// optimizer steps of given job-wide loads (one of them over two micro-batches, one skipped)
// against a hand computation, the gathered biases identical on every rank; f32 weights (the
// resident AdamW's working weights are the master) and bf16 weights with an fp32 master
// (offload_stream), whose master moves and whose working weights are its rounding; f32 under
// offload_stream too (its host master refreshes the weights every step). AdamW's own
// step leaves the biases alone (no gradient, no weight decay). Runs on 1 and 4 ranks.
// Run: ctest -R router_balance --output-on-failure
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "core/train/router_balance.h"
#include "ops/schedules/optimizer_choice.h"

namespace moepeak {
namespace {

ModelConfig deepseek() {
  ModelConfig m;
  m.model_type = ModelType::deepseek_v3;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.intermediate_size = 12;
  m.moe_intermediate_size = 4;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 2;
  m.q_lora_rank = 0;
  m.kv_lora_rank = 4;
  m.qk_nope_head_dim = 2;
  m.qk_rope_head_dim = 2;
  m.v_head_dim = 2;
  m.head_dim = 4;
  m.num_local_experts = 8;
  m.num_experts_per_tok = 2;
  m.n_group = 2;
  m.topk_group = 1;
  m.first_k_dense_replace = 1;  // layer 0 dense: no bias
  m.n_shared_experts = 1;
  return m;
}

struct Case {
  DType dtype;
  OptimizerPlacement placement;
};

void run_case(const Case& c) {
  const ModelConfig model = deepseek();
  const RankInfo ranks = init_process_group();
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  auto comm = make_comm(*backend, ranks);
  ZeroParamStore params(*backend, model, c.dtype, *comm);
  params.initialize(3, 0.5, stream);
  OptimizerConfig opt;
  opt.placement = c.placement;
  opt.weight_decay = 0.1;  // would move a decayed param: the bias is not one
  auto adamw = schedules::make_optimizer(*backend, optimizer_params(params), opt, 1);
  const double gamma = 0.25;  // exact in bf16: every bias below is a multiple of it
  RouterBiasBalance balance(params.layout(), gamma);
  ASSERT_TRUE(balance.active());

  // [step][micro-batch][layer][expert]: job-wide loads (layer 0 is dense: no loads).
  using Loads = std::vector<std::vector<int64_t>>;
  const std::vector<std::vector<Loads>> steps = {
      {{{}, {5, 3, 0, 8, 4, 4, 6, 2}, {4, 4, 4, 4, 4, 4, 4, 4}}},
      {{{}, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 8}},
       {{}, {0, 2, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 8, 0}}},  // two micro-batches
      {{{}, {9, 0, 0, 0, 0, 0, 0, 0}, {1, 2, 3, 4, 5, 6, 7, 8}}},  // skipped below
  };
  // By hand: step 1 layer 1 mean 4: {-, +, +, -, 0, 0, -, +}; layer 2 all at the mean: 0.
  // Step 2 (sums {1,3,2,2,2,2,2,2} mean 2; {0,0,0,0,0,0,8,8} mean 2): layer 1 {+, -, 0, ...},
  // layer 2 {+, +, +, +, +, +, -, -}. Step 3 is skipped: nothing moves.
  const std::vector<std::vector<double>> want = {
      {},
      {0.0, 0.0, 0.25, -0.25, 0.0, 0.0, -0.25, 0.25},
      {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, -0.25, -0.25},
  };
  for (size_t step = 0; step < steps.size(); ++step) {
    params.zero_grads(stream);
    for (const Loads& micro : steps[step]) balance.add(micro);
    const bool moved = step != 2;
    if (moved) adamw->step(static_cast<int64_t>(step) + 1, 1e-2, 1.0, stream);
    balance.apply(params, *adamw, stream, moved);
  }
  stream.synchronize();
  for (int layer = 1; layer < 3; ++layer) {
    const int p = params.layout().layers[layer].router_correction_bias;
    ASSERT_GE(p, 0);
    const std::vector<char> bytes = params.gather_full(p, stream);
    std::vector<double> got(8);
    for (size_t e = 0; e < 8; ++e) {
      if (c.dtype == DType::f32) {
        float v;
        std::memcpy(&v, bytes.data() + 4 * e, 4);
        got[e] = v;
      } else {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * e, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        got[e] = v;
      }
    }
    EXPECT_EQ(got, want[layer]) << "layer " << layer << " on rank " << ranks.rank << " of "
                                << ranks.world_size;
  }
  EXPECT_TRUE(balance.update_of(1).empty());  // the loads were cleared
}

TEST(RouterBiasBalance, ThreeStepsByHandF32Resident) {
  run_case({DType::f32, OptimizerPlacement::resident});
}

// The offloads keep a host master even for f32 weights and refresh the weights from it.
TEST(RouterBiasBalance, ThreeStepsByHandF32OffloadStream) {
  run_case({DType::f32, OptimizerPlacement::offload_stream});
}

TEST(RouterBiasBalance, ThreeStepsByHandBf16WithAnFp32Master) {
  run_case({DType::bf16, OptimizerPlacement::offload_stream});
}

TEST(RouterBiasBalance, UpdateIsTheSignOfTheMeanMinusTheLoad) {
  ParamLayout layout(deepseek());
  RouterBiasBalance balance(layout, 1e-3);
  balance.add({{}, {3, 1, 2, 2, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}});
  // Layer 1: mean 1: {-, 0, -, -, +, +, +, +} times 1e-3; layer 2: all zero loads, all at the mean.
  EXPECT_EQ(balance.update_of(1),
            (std::vector<double>{-1e-3, 0, -1e-3, -1e-3, 1e-3, 1e-3, 1e-3, 1e-3}));
  EXPECT_EQ(balance.update_of(2), std::vector<double>(8, 0.0));
  EXPECT_FALSE(RouterBiasBalance(layout, 0.0).active());
}

}  // namespace
}  // namespace moepeak
