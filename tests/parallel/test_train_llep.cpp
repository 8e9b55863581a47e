// Whole training steps with schedules.dispatch = "pipelined_llep" (and "llep") on W real rank
// processes against the standard dispatcher on one rank, same global batches and seed, float32:
// every rank also trains the one-rank standard model locally as the reference. Checks
//   - the loss and grad norm of each of 6 AdamW steps within 1e-5 relative (the dispatchers
//     compute the same function; rows land in other GEMMs and expert gradients are summed per
//     chunk and per helper in another order, so agreement is to fp32 rounding, not bitwise);
//   - every parameter's gradient after step 1 (gathered) within 1e-5 of the tensor's largest;
//   - the `dispatch` live-set peak of a step equals pipelined_llep_dispatch_bytes(N, k, H, F, b,
//     W, params) — the function the planner uses and the dispatcher sizes its buffers with —
//     whatever the router does (for llep: at most llep_dispatch_bytes), and is under
//     pipelined_llep_bound_bytes whenever the launch shape is `bounded`;
//   - with llep_lambda = 1 and min_tokens_per_gemm = 1 LLEP spills whenever one rank is above
//     the mean, so spilled experts' weights travel and their gradients return inside training;
//   - on one rank (this process, no MPI peers) pipelined_llep against the one-rank standard:
//     LLEP has nothing to balance there, the pipeline still chunks and its bound still holds.
// Run: ctest -R train_llep --output-on-failure   (2 and 4 ranks under mpirun)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/decoder.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {

using test_support::global_batch;
using test_support::rel;
using test_support::scaled_error;
using test_support::TrainingRun;

struct Case {
  const char* name;
  DispatchSchedule dispatch;
  CheckpointSchedule checkpoint;
  ChunkMembership membership;
  int64_t chunk_tokens, max_chunks;
  int64_t batch, seq_len;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ModelConfig model_config() {
  ModelConfig m;
  m.vocab_size = 37;
  m.hidden_size = 16;
  m.intermediate_size = 20;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 8;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  m.initializer_range = 0.2;
  return m;
}

SchedulesConfig schedules_of(const Case& c) {
  SchedulesConfig s;
  s.dispatch = c.dispatch;
  s.checkpoint = c.checkpoint;
  s.chunk_membership = c.membership;
  s.chunk_tokens = c.chunk_tokens;
  s.max_chunks = c.max_chunks;
  s.llep_lambda = 1.0;  // spill whenever a rank is above the mean
  s.min_tokens_per_gemm = 1;
  return s;
}

// Trains `dist` (on `ranks`) beside the one-rank standard model and checks losses, norms,
// step-1 gradients and the dispatch peak.
void train_and_compare(const Case& c, const RankInfo& ranks) {
  const ModelConfig cfg = model_config();
  const int64_t B = c.batch, T = c.seq_len, W = ranks.world_size;
  SchedulesConfig ref_schedules;
  ref_schedules.checkpoint = c.checkpoint;
  TrainingRun ref(RankInfo{}, cfg, ref_schedules);  // one rank, standard dispatch
  const SchedulesConfig s = schedules_of(c);
  TrainingRun dist(ranks, cfg, s);
  const ParamLayout& layout = ref.model->params().layout();
  const int64_t N = B * T / W, k = cfg.num_experts_per_tok;

  std::vector<int64_t> gids, glabels;
  for (int step = 1; step <= 6; ++step) {
    global_batch(step, B * T, cfg.vocab_size, gids, glabels, /*salt=*/7);
    const double ref_loss = ref.forward_backward(gids, glabels, B, T);
    dist.backend->arena().reset_peaks();
    const double loss = dist.forward_backward(gids, glabels, B, T);
    EXPECT_LT(rel(loss, ref_loss), 1e-5)
        << c.name << " step " << step << ": " << loss << " vs one rank " << ref_loss;
    const double ref_norm = ref.grad_norm(), norm = dist.grad_norm();
    EXPECT_LT(rel(norm, ref_norm), 1e-5) << c.name << " step " << step << " grad norm";

    const uint64_t peak = dist.backend->arena().stats().peak_per_set()[LiveSet::dispatch];
    if (c.dispatch == DispatchSchedule::pipelined_llep) {
      const auto q = schedules::pipelined_llep_params(s);
      const int64_t H = cfg.hidden_size, F = cfg.intermediate_size;
      EXPECT_EQ(peak, schedules::pipelined_llep_dispatch_bytes(N, k, H, F, DType::f32, W, q))
          << c.name << " step " << step << ": dispatch peak against the planner's function";
      // Under 2 W M_c H b + metadata when the launch shape says the rows fit; these rows are
      // 16 and 20 floats, narrower than the arena's 256-byte granule, so mostly they do not
      // (the header's corner case) and the peak is over the bound, as documented.
      const auto shape = schedules::pipelined_llep_shape(N, k, H, F, DType::f32, W, q);
      const uint64_t bound = schedules::pipelined_llep_bound_bytes(N, k, H, F, DType::f32, W, q);
      if (shape.bounded) {
        EXPECT_LE(peak, bound) << c.name << " step " << step;
      } else {
        EXPECT_GT(peak, bound) << c.name << " step " << step;
      }
      if (step == 1 && init_process_group().rank == 0) {
        std::printf("[%s W=%lld] S=%lld T=%lld, dispatch peak %llu, bound %llu%s\n", c.name,
                    static_cast<long long>(W), static_cast<long long>(shape.slots),
                    static_cast<long long>(shape.tile_rows), static_cast<unsigned long long>(peak),
                    static_cast<unsigned long long>(bound),
                    shape.bounded ? "" : " (over: corner case)");
      }
    } else {
      EXPECT_LE(peak,
                schedules::llep_dispatch_bytes(
                    N, k, cfg.hidden_size, cfg.intermediate_size, DType::f32, W,
                    schedules::LlepParams{s.llep_alpha, s.llep_lambda, s.min_tokens_per_gemm}))
          << c.name << " step " << step;
    }
    if (step == 1) {
      for (size_t p = 0; p < layout.params().size(); ++p) {
        const int i = static_cast<int>(p);
        const double worst = scaled_error(dist.gathered(i, dist.model->params().flat_grads()),
                                          ref.gathered(i, ref.model->params().flat_grads()));
        EXPECT_LT(worst, 1e-5) << c.name << ": " << layout.params()[p].name
                               << " gradient after step 1";
      }
    }
    const double lr = 1e-2 * std::min(1.0, step / 3.0);
    ref.update(step, ref_norm, lr);
    dist.update(step, norm, lr);
  }
}

class TrainLlep : public ::testing::TestWithParam<Case> {};

TEST_P(TrainLlep, MatchesOneRankStandard) { train_and_compare(GetParam(), init_process_group()); }

INSTANTIATE_TEST_SUITE_P(
    Dispatch, TrainLlep,
    ::testing::Values(
        // c = 3 tokens: K = ceil(N / 3) chunks per layer (N = 8 on 2 ranks, 4 on 4)
        Case{"pipelined_strided", DispatchSchedule::pipelined_llep, CheckpointSchedule::standard,
             ChunkMembership::strided, 3, 16, 2, 8},
        // every activation kept (no recompute): each layer's dispatcher holds its plans
        Case{"pipelined_contiguous_none", DispatchSchedule::pipelined_llep,
             CheckpointSchedule::none, ChunkMembership::contiguous, 2, 3, 2, 8},
        Case{"llep", DispatchSchedule::llep, CheckpointSchedule::standard, ChunkMembership::strided,
             4096, 16, 2, 8}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// One rank (this process only; the peers run the same): pipelined_llep degenerates to chunked
// dispatch without spills and still matches the standard one-rank model.
TEST(TrainLlepOneRank, PipelinedMatchesStandard) {
  init_process_group();
  train_and_compare(Case{"one_rank_pipelined", DispatchSchedule::pipelined_llep,
                         CheckpointSchedule::standard, ChunkMembership::strided, 5, 16, 2, 8},
                    RankInfo{});
}

}  // namespace
}  // namespace moepeak
