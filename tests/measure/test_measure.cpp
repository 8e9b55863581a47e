// The measurement layer (core/measure): the harness's seeded inputs and statistics, one MoE
// layer's dispatch harness against the schedules' bounds, tune's grids and sweeps on the tiny
// config, and tune's measure-and-select end to end, all on one rank of the CPU backend. The CLI
// (bench_*, tune) only prints what these return; tests/tune/test_tune_cli.sh runs it on 2 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/measure/dispatch_layer.h"
#include "core/measure/harness.h"
#include "core/measure/sweeps.h"
#include "core/measure/tune_run.h"
#include "core/runtime/backend.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::measure {
namespace {

// The tiny config with a small batch: every sweep point runs in milliseconds.
Config small_config() {
  return load_config({}, {"training.batch_size=2", "training.seq_len=64",
                          "runtime.device_memory=512MiB", "metrics.progress=off"});
}

TEST(Harness, MedianOfOddEvenAndNone) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
}

TEST(Harness, MaxScaledErrIsRelativeToTheReferenceAndInfiniteOnNan) {
  EXPECT_EQ(max_scaled_err({1, 2, 3}, {1, 2, 3}), 0);
  EXPECT_DOUBLE_EQ(max_scaled_err({1, 2, 5}, {1, 2, 4}), 0.25);
  EXPECT_DOUBLE_EQ(max_scaled_err({0.5, 0}, {0, 0}), 0.5);  // absolute when the reference is 0
  EXPECT_EQ(max_scaled_err({std::nan("")}, {1}), std::numeric_limits<double>::infinity());
}

TEST(Harness, MaxOverRanksOfOneRankIsTheValue) {
  auto backend = Backend::create(BackendOptions{});
  auto comm = make_comm(*backend, RankInfo{});
  std::vector<double> v = {1, 5, 2};
  max_over_ranks(*comm, *backend, v);
  EXPECT_EQ(v, (std::vector<double>{1, 5, 2}));
  EXPECT_EQ(max_over_ranks(*comm, *backend, 7.5), 7.5);
}

class SeededRoutingKinds : public ::testing::TestWithParam<std::string> {};

TEST_P(SeededRoutingKinds, KDistinctExpertsWithWeightsSummingToOne) {
  const int64_t N = 300, E = 8, k = 3;
  std::mt19937_64 rng(5);
  const SeededRouting r = seeded_routing(GetParam(), N, E, k, 1.2, 4, rng);
  ASSERT_EQ(r.index.size(), static_cast<size_t>(N * k));
  std::vector<int64_t> count(E, 0);
  for (int64_t n = 0; n < N; ++n) {
    std::set<int32_t> experts;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = r.index[n * k + j];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, E);
      experts.insert(e);
      ++count[e];
      EXPECT_GT(r.weight[n * k + j], 0);
      sum += r.weight[n * k + j];
    }
    EXPECT_EQ(experts.size(), static_cast<size_t>(k)) << "token " << n;
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  if (GetParam() == "adversarial") {
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(count[e], e < k ? N : 0) << "expert " << e;
  }
  if (GetParam() == "zipf") {
    EXPECT_GT(count[0], 2 * count[E - 1]) << "expert 0 is the hot one";
  }
  std::mt19937_64 again(5);
  const SeededRouting r2 = seeded_routing(GetParam(), N, E, k, 1.2, 4, again);
  EXPECT_EQ(r.index, r2.index) << "the same seed draws the same routing";
  EXPECT_EQ(r.weight, r2.weight);
}

INSTANTIATE_TEST_SUITE_P(Measure, SeededRoutingKinds,
                         ::testing::Values("balanced", "zipf", "segments", "adversarial"),
                         [](const auto& info) { return info.param; });

TEST(Harness, SeededRoutingRejectsAnUnknownKind) {
  std::mt19937_64 rng(1);
  EXPECT_THROW(seeded_routing("hot", 4, 4, 2, 1.2, 1, rng), Error);
}

TEST(Harness, SeededExpertsAreTheSameWhicheverRankOwnsThem) {
  auto backend = Backend::create(BackendOptions{});
  std::vector<OwnedTensor> whole_storage, half_storage;
  const auto whole = seeded_local_experts(*backend, DType::f64, 4, 0, 1, 8, 16, whole_storage);
  const auto half = seeded_local_experts(*backend, DType::f64, 4, 1, 2, 8, 16, half_storage);
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(half.size(), 2u);
  Stream& s = backend->default_stream();
  for (int e = 0; e < 2; ++e) {  // rank 1 of 2 owns experts 2 and 3
    EXPECT_EQ(copy_to_host_as_double(half[e].w1, *backend, s),
              copy_to_host_as_double(whole[2 + e].w1, *backend, s));
    EXPECT_EQ(copy_to_host_as_double(half[e].w2, *backend, s),
              copy_to_host_as_double(whole[2 + e].w2, *backend, s));
  }
}

// The dispatch harness on one rank: PipelinedLLEP's out, dx and expert gradients match the
// standard dispatcher's (f64: chunking reorders only the weight-gradient sums), its `dispatch`
// peak equals pipelined_llep_dispatch_bytes, and every recompute mode runs.
TEST(DispatchLayerHarness, PipelinedMatchesStandardWithinItsBound) {
  auto backend = Backend::create(BackendOptions{});
  auto comm = make_comm(*backend, RankInfo{});
  const DispatchLayerShape shape{96, 16, 32, 4, 2, DType::f64, "zipf", 1.2, 1};
  DispatchLayer layer(*backend, *comm, shape);
  Stream& stream = backend->default_stream();
  schedules::StandardDispatch standard(*backend, stream, DType::f64);
  const DispatchRun ref = layer.run(standard, 1, 2, Recompute::output, true);
  schedules::PipelinedLlepParams q;
  q.chunk_tokens = 24;
  schedules::PipelinedLlepDispatch pipelined(*backend, stream, *comm, DType::f64, 4, q);
  const DispatchRun got = layer.run(pipelined, 1, 2, Recompute::plan_only, true);
  EXPECT_EQ(ref.times.size(), 2u);
  EXPECT_EQ(got.times.size(), 2u);
  EXPECT_LT(max_scaled_err(got.out, ref.out), 1e-12);
  EXPECT_LT(max_scaled_err(got.dx, ref.dx), 1e-12);
  EXPECT_LT(max_scaled_err(got.dweight, ref.dweight), 1e-12);
  EXPECT_LT(max_scaled_err(got.dw, ref.dw), 1e-12);
  EXPECT_EQ(got.stats.peak_per_set()[LiveSet::dispatch],
            schedules::pipelined_llep_dispatch_bytes(96, 2, 16, 32, DType::f64, 1, q));
  const DispatchRun plain = layer.run(pipelined, 0, 1);
  EXPECT_TRUE(plain.out.empty()) << "results are read only when asked for";
}

TEST(DispatchLayerHarness, RejectsExpertsThatDoNotSplitOverTheRanksOrTopKOverE) {
  auto backend = Backend::create(BackendOptions{});
  auto comm = make_comm(*backend, RankInfo{});
  EXPECT_THROW(DispatchLayer(*backend, *comm, {8, 4, 4, 2, 3, DType::f32, "zipf", 1.2, 1}), Error);
  // bf16 is a storage dtype of every backend (the CPU's ops widen to fp32).
  EXPECT_NO_THROW(DispatchLayer(*backend, *comm, {8, 4, 4, 2, 1, DType::bf16, "zipf", 1.2, 1}));
}

TEST(TuneGridsTest, ShapeAndGridsOfTheTinyConfig) {
  const Config cfg = small_config();
  const TuneShape s = tune_shape(cfg, 1);
  EXPECT_EQ(s.tokens, 2 * 64);
  EXPECT_EQ(s.hidden, cfg.model.hidden_size);
  EXPECT_EQ(s.experts, cfg.model.num_local_experts);
  EXPECT_EQ(s.sco_batch * s.sco_seq_len, s.tokens);
  // Every dispatch point has an effective (K, c_eff) of its own.
  std::set<std::pair<int64_t, int64_t>> effective;
  for (const auto& [c, kmax] : dispatch_grid(cfg, s)) {
    auto q = schedules::pipelined_llep_params(cfg.schedules);
    q.chunk_tokens = c;
    q.max_chunks = kmax;
    const auto shape = schedules::pipelined_llep_shape(s.tokens, s.top_k, s.world, q);
    EXPECT_TRUE(effective.insert({shape.chunks, shape.chunk_tokens}).second)
        << "c " << c << " K_max " << kmax << " repeats an effective shape";
  }
  EXPECT_GE(effective.size(), 2u);
  std::set<std::pair<int64_t, int64_t>> staging;
  for (const auto& [beta, slots] : optimizer_grid(cfg, s)) {
    const auto shape = schedules::offload_stream_shape(s.params, beta, slots);
    EXPECT_TRUE(staging.insert({shape.bucket, shape.slots}).second)
        << "beta " << beta << " s " << slots << " repeats an effective shape";
  }
  EXPECT_GE(staging.size(), 3u);
  for (VocabPayload payload : {VocabPayload::activations, VocabPayload::weights}) {
    const std::vector<int64_t> kept = vocab_kept_grid(cfg, s, payload);
    ASSERT_FALSE(kept.empty());
    EXPECT_EQ(kept.front(), 0);
    for (size_t i = 1; i < kept.size(); ++i) EXPECT_GT(kept[i], kept[i - 1]);
  }
  EXPECT_THROW(tune_shape(cfg, 3), Error) << "4 experts cannot split over 3 ranks";
}

// Each sweep on one rank: one point per grid entry, its measured peak equal to its formula.
TEST(Sweeps, EveryPointMeasuredAtItsBound) {
  const Config cfg = small_config();
  const TuneShape s = tune_shape(cfg, 1);
  SweepRun run;
  run.warmup = 0;
  run.repeats = 1;
  int ticks = 0;
  run.tick = [&](const std::string&) { ++ticks; };

  const auto dgrid = dispatch_grid(cfg, s);
  const auto dispatch = sweep_dispatch(cfg, RankInfo{}, s, dgrid, run);
  ASSERT_EQ(dispatch.size(), dgrid.size());
  for (const auto& p : dispatch) {
    EXPECT_EQ(p.peak_bytes, p.bound_bytes) << "c " << p.chunk_tokens;
    EXPECT_EQ(p.time.repeats, 1);
    EXPECT_GT(p.time.median_s, 0);
  }
  const auto ogrid = optimizer_grid(cfg, s);
  const OptimizerSweep optimizer = sweep_optimizer(cfg, RankInfo{}, s, ogrid, run);
  ASSERT_EQ(optimizer.points.size(), ogrid.size());
  for (const auto& p : optimizer.points) EXPECT_EQ(p.staging_bytes, p.bound_bytes);
  EXPECT_GT(optimizer.floor_s, 0);
  std::vector<std::pair<VocabPayload, int64_t>> vgrid;
  for (int64_t kept : vocab_kept_grid(cfg, s, VocabPayload::weights)) {
    vgrid.emplace_back(VocabPayload::weights, kept);
  }
  const auto vocab = sweep_vocab(cfg, RankInfo{}, s, vgrid, run);
  ASSERT_EQ(vocab.size(), vgrid.size());
  for (const auto& p : vocab) EXPECT_EQ(p.peak_bytes, p.bound_bytes) << "kept " << p.kept_strips;
  const ScoSweepResult sco = sweep_sco(cfg, RankInfo{}, s, run);
  ASSERT_EQ(sco.points.size(), 3u);  // none, half, all
  EXPECT_EQ(sco.points.front().offloaded_layers, 0);
  EXPECT_EQ(sco.points.back().offloaded_layers, cfg.model.num_hidden_layers);
  for (const auto& p : sco.points) EXPECT_LE(p.peak_bytes, sco.standard_boundaries);
  EXPECT_EQ(ticks, static_cast<int>(dgrid.size() + ogrid.size() + vgrid.size()) + sco_ticks(run));
}

TEST(TuneRun, MeasuresSelectsAndPlansTheChosenConfig) {
  const Config cfg = small_config();
  TuneRequest request;
  request.warmup = 0;
  request.repeats = 1;
  // One repetition on a loaded machine is noise: accept any SCO overhead (the rule itself is
  // test_tune_select's), so the test never depends on timing.
  request.sco_tolerance = 1e9;
  const TuneGrids g = tune_grids(cfg, 1, request);
  EXPECT_EQ(g.base.schedules.dispatch, DispatchSchedule::pipelined_llep);
  EXPECT_EQ(g.base.optimizer.placement, OptimizerPlacement::offload_stream);
  EXPECT_EQ(g.base.schedules.vocab, VocabSchedule::ring_dtp);
  EXPECT_EQ(g.base.schedules.checkpoint, CheckpointSchedule::sco);
  int ticks = 0;
  const TuneOutcome o =
      tune_measure_and_select(cfg, RankInfo{}, g, request, [&](const std::string&) { ++ticks; });
  EXPECT_EQ(ticks, g.ticks);
  EXPECT_TRUE(o.final_plan.fits());
  ASSERT_LT(o.dispatch_choice.index, o.dispatch_points.size());
  EXPECT_EQ(o.tuned.schedules.chunk_tokens,
            o.dispatch_points[o.dispatch_choice.index].chunk_tokens);
  ASSERT_LT(o.optimizer_choice.index, o.optimizer_sweep.points.size());
  EXPECT_EQ(o.tuned.optimizer.bucket_params,
            o.optimizer_sweep.points[o.optimizer_choice.index].bucket_params);
  ASSERT_LT(o.kept_choice.index, o.vocab_points.size());
  EXPECT_EQ(o.tuned.schedules.vocab_kept_strips, o.vocab_points[o.kept_choice.index].kept_strips);
  EXPECT_FALSE(o.dispatch_choice.reason.empty());
  // Only the requested sweeps run.
  TuneRequest only_dispatch = request;
  only_dispatch.sweeps = {"dispatch"};
  const TuneGrids d = tune_grids(cfg, 1, only_dispatch);
  EXPECT_TRUE(d.optimizer_grid.empty() && d.vocab_grid.empty() && !d.sco);
  EXPECT_EQ(d.base.optimizer.placement, cfg.optimizer.placement);
}

}  // namespace
}  // namespace moepeak::measure
