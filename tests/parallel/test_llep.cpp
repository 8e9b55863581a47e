// LlepDispatch and PipelinedLlepDispatch on W real rank processes against the standard
// expert-parallel dispatcher (ExpertParallelDispatch) on the same ranks and inputs.
//
// Every rank builds the same full problem from a seed — N_r = 48 + 2r tokens on rank r (uneven,
// so K and c_eff come from the largest), E = 8 experts of H = 64, F = 160, top-2 — and runs on its
// token slice and its experts [r*E/W, (r+1)*E/W). Routing: balanced (uniform), Zipf-skewed
// (p(e) ~ 1/(e+1)^2, expert 0 hot) and adversarial (every token picks experts 0 and 1, both on
// rank 0). Checked, in f64 and f32:
//   - out, dx, dweight and every local expert weight gradient within 1e-13 (f64) / 2e-6 (f32)
//     relative of the standard's, and in f32 also within 2e-6 of the standard dispatcher run in
//     f64 (float64-checked). Why not bitwise: a row's expert output is the same dot products in
//     the same order, but OpenBLAS computes the rows of a GEMM with different kernels depending
//     on where they fall in its register blocking (the M remainder), so the same row can round
//     differently in a GEMM of another row count (checked: most sub-GEMMs of a 40-row GEMM differ
//     in the last bit). The pipeline runs each expert over per-chunk tiles of T rows and over F
//     in blocks (y and dx summed block by block, dweight as g . (dout w2) over F instead of
//     dout . y over H), and a spill splits an expert's rows between ranks: differences of an ulp
//     or so (measured <= 1.3e-15 f64, <= 4.4e-7 f32 on 2 and 4 ranks). Weight gradients are
//     moreover summed per chunk, per tile and per helper in another order (measured <= 1.5e-15
//     f64, <= 6.5e-7 f32); the f32 results are within 5.8e-7 of the f64 standard, as close as
//     LLEP's f32 (6.8e-7). The tolerances leave a 3x (f32) and 65x (f64) margin.
//     Bitwise where the GEMMs are the same: LlepDispatch when no expert is split (the gate
//     kept every expert home, or whole experts moved) gives bitwise out, dx, dweight and dW —
//     checked;
//   - bf16 storage (every sum over F blocks, chunks, tiles and helpers in fp32; the expert
//     gradients fp32 main grads): against the bf16 standard within 2^-6 and against the f64
//     standard no less accurate than the bf16 standard (x 1.5); also on 1 rank;
//   - the f64 standard dispatcher itself against the float64 host reference (tests/
//     moe_reference.h) within 1e-12, every case;
//   - poisoned inputs: dweight (=) NaN beforehand, the whole free arena NaN (a buffer read before
//     it is written shows up); out, dx and dW (+=) start from seeded values;
//   - the global expert counts equal the standard's (routing is never changed);
//   - memory: LLEP's measured `dispatch` peak equals dispatch_expert_parallel_bytes for the rows
//     it computed and stays under llep_dispatch_bytes; PipelinedLLEP's equals
//     pipelined_llep_dispatch_bytes in all three routings (fixed at launch) and is at most
//     pipelined_llep_bound_bytes = 2 * Ep * k * c_eff * H * b + the per-chunk metadata (H * b is
//     a whole number of 256-byte granules, so footprint rounding leaves the tiles room), no chunk
//     receives more than R_c rows; the launch shape's slots: S = 1 on 2 ranks, S = 2 on 4 at the
//     defaults, S = 1 on 4 with lambda = 2 (two slots would not fit), and the corner case
//     lambda = W - 0.4 (over the bound by exactly the documented rows); schedules.llep_slots = 2
//     and 3 on 2 and 4 ranks (exact, the peak the formula's, over the bound by the documented
//     rows where they do not fit); the standard dispatcher's peak on rank 0 grows from balanced
//     to adversarial;
//   - spills happen (adversarial: every chunk's plan spills, weights travel, gradients return);
//     the measured `weights` and `grads` peaks are the copies (and the owner's returned-gradient
//     scratch) exactly, each of the bytes llep_spill_copy_bytes counts per copy;
//   - each of the three streams (compute, dispatch lane, return lane) slowed on purpose (a missing
//     wait would corrupt a slot: with S >= 2 chunk i+1's dispatch and chunk i-1's return overlap
//     chunk i's experts; S = 1 once more with the dispatch lane slowed); forward, then the
//     checkpoint's recompute as a plan-only forward (undefined `out`), then backward; LLEP with the
//     recompute as a full forward; strided and contiguous chunks; K capped by K_max; one chunk;
//     errors.
//
//     ctest -R test_llep --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/parallel/test_llep
//
// Registered with 4 and 2 ranks (tests/parallel/llep.cmake); 2 cores serve them, so shapes are
// tiny. The problem, runs and checks are llep_testing.h's, shared with test_llep_gpt_oss.cpp
// (the same cases with gpt-oss's expert biases and clamped SwiGLU; one binary).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/parallel/llep_testing.h"

// In the helpers' namespace (llep_testing::Routing, not the config's moepeak::Routing).
namespace moepeak::llep_testing {
namespace {

TEST_F(LlepTest, LlepMatchesStandardF64) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::f64, r, 31);
}
TEST_F(LlepTest, LlepMatchesStandardF32) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::f32, r, 32);
}

TEST_F(LlepTest, PipelinedStridedMatchesStandardF64) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 41, q, false, -1, {default_slots(), true});
  }
}
TEST_F(LlepTest, PipelinedStridedMatchesStandardF32) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f32, r, 42, q, false, -1, {default_slots(), true});
  }
}
// bf16 storage: every sum over F blocks, chunks, tiles and helpers in fp32 (the tile
// accumulators, the fp32 expert gradients), so the pipeline is within one bf16 rounding of the
// standard dispatcher in bf16 on the same inputs (measured: see the file comment).
TEST_F(LlepTest, PipelinedStridedMatchesStandardBf16) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const bool bounded = schedules::pipelined_llep_shape(
                           tokens_of(init_process_group().world_size - 1), kTopK, kHidden, kFfn,
                           DType::bf16, init_process_group().world_size, q)
                           .bounded;
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::bf16, r, 43, q, false, -1, {0, bounded});
  }
}
TEST_F(LlepTest, LlepMatchesStandardBf16) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::bf16, r, 33);
}
TEST_F(LlepTest, HelpedExpertLimitRaisedToEveryForeignExpert) {
  // schedules.llep_max_helped_experts = E - E/W: the copies bound is then E - E/W, and the
  // plans may differ from the default's (E/W + 1); still exact.
  const int64_t W = init_process_group().world_size;
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_llep(DType::f64, r, 33, kExperts - kExperts / W);
  }
  PipelinedLlepParams q = pipeline_params(12, 16, ChunkMembership::strided);
  q.max_helped_experts = kExperts - kExperts / W;
  check_pipelined(DType::f64, Routing::zipf, 43, q, false, -1, {default_slots(), true});
}

TEST_F(LlepTest, PipelinedContiguousAndCappedChunkCountMatchStandard) {
  // Contiguous membership; and c = 1 with K_max = 3: K = 3 chunks of c_eff = ceil(N_max / 3).
  check_pipelined(DType::f64, Routing::zipf, 51,
                  pipeline_params(12, 16, ChunkMembership::contiguous), false, -1,
                  {default_slots(), true});
  check_pipelined(DType::f32, Routing::adversarial, 52,
                  pipeline_params(12, 16, ChunkMembership::contiguous), false, -1,
                  {default_slots(), true});
  check_pipelined(DType::f64, Routing::adversarial, 53,
                  pipeline_params(1, 3, ChunkMembership::strided), false, -1,
                  {default_slots(), true});
  // One chunk (c >= N): the pipeline degenerates to LLEP with recompute.
  check_pipelined(DType::f64, Routing::zipf, 54,
                  pipeline_params(1000, 16, ChunkMembership::strided), false, -1,
                  {default_slots(), true});
}

TEST_F(LlepTest, PipelinedOneSlotWhereTwoDoNotFit) {
  // lambda = 2: R_c = 2 M_c, so two slots would need 2 + 4 * 2 = 10 U > 2 W U on 4 ranks (and
  // on 2): one slot, 1 + 2 * 2 = 5 U, fits 8 U on 4 ranks; on 2 (4 U) it does not (below).
  if (init_process_group().world_size < 4) GTEST_SKIP() << "needs 4 ranks";
  const auto q = pipeline_params(12, 16, ChunkMembership::strided, 2.0);
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 55, q, false, -1, {1, true});
  }
  check_pipelined(DType::f32, Routing::adversarial, 56, q, true, 1, {1, true});  // comm slowed
}

TEST_F(LlepTest, PipelinedOverTheBoundInTheCornerCase) {
  // lambda = W - 0.4: one slot needs 1 + 2 rho ~ 2 W + 0.2 U of rows before any tile, over
  // 2 W U: the dispatcher still runs (S = 1, T = T_min) and is over the bound by exactly the
  // documented amount.
  const double lambda = static_cast<double>(init_process_group().world_size) - 0.4;
  const auto q = pipeline_params(12, 16, ChunkMembership::strided, lambda);
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 57, q, false, -1, {1, false});
  }
}

TEST_F(LlepTest, DispatchPeakIsFixedWhileTheStandardGrowsWithSkew) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (DType dtype : {DType::f64, DType::f32}) {
    std::vector<uint64_t> pipelined, standard;
    for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
      pipelined.push_back(check_pipelined(dtype, r, 61, q, false, -1, {default_slots(), true}));
      Env env(dtype);
      standard.push_back(run_standard(env, make_problem(61, r, env.world())).dispatch_peak);
    }
    Env env(dtype);
    EXPECT_EQ(pipelined[0], pipelined[1]);
    EXPECT_EQ(pipelined[0], pipelined[2]);
    if (env.rank() == 0 && env.world() > 1) {
      // Rank 0 owns experts 0 and 1: the adversarial routing sends it every row.
      EXPECT_GT(standard[2], standard[0]);
      EXPECT_GE(standard[1], standard[0]);
      std::printf(
          "[W=%lld %s] rank 0 dispatch peak bytes: standard %llu / %llu / %llu "
          "(balanced / zipf / adversarial), pipelined llep %llu in all three\n",
          static_cast<long long>(env.world()), std::string(dtype_name(dtype)).c_str(),
          static_cast<unsigned long long>(standard[0]),
          static_cast<unsigned long long>(standard[1]),
          static_cast<unsigned long long>(standard[2]),
          static_cast<unsigned long long>(pipelined[0]));
    }
  }
}

TEST_F(LlepTest, SlowedStreamsAndRecompute) {
  // Two slots on 4 ranks: chunk i+1's dispatch overlaps chunk i's experts, so a missing event
  // wait shows up as a corrupted slot when one stream is slowed (one slot on 2 ranks: the
  // dispatch waits for the previous chunk's combine).
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const Expect e{default_slots(), true};
  check_pipelined(DType::f64, Routing::adversarial, 71, q, false, 0, e);
  check_pipelined(DType::f64, Routing::zipf, 72, q, false, 1, e);
  check_pipelined(DType::f32, Routing::adversarial, 73, q, true, -1, e);
  check_pipelined(DType::f64, Routing::zipf, 74, q, true, 1, e);
}

TEST_F(LlepTest, AskedSlotsAtAnyWorldSize) {
  // schedules.llep_slots: two slots on 2 ranks (where the rule picks one: 7.2 U > 4 U, so over
  // the bound by the documented rows) and on 4; three on both (dispatch of chunk i+1, experts of
  // chunk i and the return of chunk i-1 with no wait between them) — each with every one of the
  // three streams slowed in turn, and the plan-only recompute.
  const int64_t W = init_process_group().world_size;
  for (int64_t slots : {2, 3}) {
    PipelinedLlepParams q = pipeline_params(12, 16, ChunkMembership::strided);
    q.slots = slots;
    const bool fits = slots == 2 && W >= 4;  // 2 + 4 rho = 7.2 U <= 2 W U = 8 U
    const Expect e{slots, fits};
    check_pipelined(DType::f64, Routing::adversarial, 81, q, false, -1, e);
    check_pipelined(DType::f64, Routing::zipf, 82, q, true, 0, e);
    check_pipelined(DType::f64, Routing::adversarial, 83, q, false, 1, e);
    check_pipelined(DType::f32, Routing::adversarial, 84, q, true, 2, e);
  }
}

TEST_F(LlepTest, LayersShareOneLane) {
  // The model gives every layer's dispatcher one lane (PipelinedLlepLane: one duplicated
  // communicator, one comm stream). Two layers on one lane, run as a step runs them — forward
  // of both, then backward in reverse — with the lane slowed, give the same bits as each on a
  // lane of its own.
  Env env(DType::f64);
  const int64_t W = env.world();
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const Problem pa = make_problem(91, Routing::zipf, W);
  const Problem pb = make_problem(92, Routing::adversarial, W);
  std::vector<Result> alone;
  for (const Problem* p : {&pa, &pb}) {
    PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q);
    alone.push_back(run_dispatch(env, *p, d));
  }
  auto lane = schedules::PipelinedLlepLane::make(env.backend(), env.comm());
  PipelinedLlepDispatch da(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q, lane);
  PipelinedLlepDispatch db(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q, lane);
  EXPECT_EQ(&da.comm_stream(), lane->stream.get());
  EXPECT_EQ(&db.comm_stream(), lane->stream.get());
  LayerRun a(env, pa), b(env, pb);
  as_cpu_stream(*lane->stream).set_debug_delay(std::chrono::microseconds(300));
  a.forward(da);
  b.forward(db);
  b.backward(db);
  a.backward(da);
  env.stream().synchronize();
  as_cpu_stream(*lane->stream).set_debug_delay(std::chrono::microseconds(0));
  EXPECT_EQ(env.backend().arena().stats().current()[LiveSet::dispatch], 0u);
  const Result shared[2] = {a.read(env), b.read(env)};
  for (int l = 0; l < 2; ++l) {
    const std::string what = "layer " + std::to_string(l) + " on a shared lane";
    EXPECT_TRUE(compare(shared[l].out, alone[l].out).bitwise) << what << ": out";
    EXPECT_TRUE(compare(shared[l].dx, alone[l].dx).bitwise) << what << ": dx";
    EXPECT_TRUE(compare(shared[l].dweight, alone[l].dweight).bitwise) << what << ": dweight";
    ASSERT_EQ(shared[l].dw.size(), alone[l].dw.size());
    for (size_t e = 0; e < shared[l].dw.size(); ++e) {
      EXPECT_TRUE(compare(shared[l].dw[e], alone[l].dw[e]).bitwise) << what << ": dW " << e;
    }
  }
  EXPECT_EQ(da.expert_counts(), alone[0].counts);
  EXPECT_EQ(db.expert_counts(), alone[1].counts);
}

TEST_F(LlepTest, LlepWithRecompute) {
  Env env(DType::f64);
  const Problem p = make_problem(81, Routing::zipf, env.world());
  References refs = references(DType::f64, p);
  LlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, {1.0, 1.3, 2});
  Result got = run_dispatch(env, p, d, true);
  check_against_standard(env, got, refs.ref, nullptr, "llep f64 zipf recompute", false);
}

TEST_F(LlepTest, Errors) {
  Env env(DType::f64);
  const int64_t W = env.world();
  if (W > 1) {
    EXPECT_THROW(LlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, W + 1), Error);
    try {
      PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, W + 1);
      FAIL() << "E = W + 1 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("E = " + std::to_string(W + 1)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("W = " + std::to_string(W)), std::string::npos) << e.message();
    }
  }
  PipelinedLlepParams bad;
  bad.chunk_tokens = 0;
  EXPECT_THROW(
      PipelinedLlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, bad),
      Error);
  PipelinedLlepParams four_slots;
  four_slots.slots = schedules::kPipelinedLlepMaxSlots + 1;
  try {
    PipelinedLlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, kExperts,
                          four_slots);
    ADD_FAILURE() << "4 slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("schedules.llep_slots = 4"), std::string::npos) << e.message();
  }
  PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts);
  LlepDispatch l(env.backend(), env.stream(), env.comm(), DType::f64, kExperts);
  auto t = env.nan_output(Shape{2, kHidden});
  auto w = env.nan_output(Shape{2, kTopK});
  EXPECT_THROW(d.backward(t, {}, t, w), Error);
  EXPECT_THROW(l.backward(t, {}, t, w), Error);
  // A wrong number of local experts is found before any collective.
  Problem p = make_problem(5, Routing::balanced, W);
  Experts too_many = make_experts(env, p, 0, kExperts / W + 1);
  auto index = env.index(p.index, 0, 2);
  EXPECT_THROW(d.forward(t, index, w, too_many.weights, t), Error);
  EXPECT_THROW(l.forward(t, index, w, too_many.weights, t), Error);
}

}  // namespace
}  // namespace moepeak::llep_testing
