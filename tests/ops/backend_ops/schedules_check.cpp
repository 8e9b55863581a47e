// test_backend_ops, the four bounded schedules on the backend under test (its streams, its copy
// engine, its pinned host pool), each beside the standard schedule it replaces, in f32 on one
// rank of a tiny Mixtral (2 layers, GQA, 4 experts top-2):
//   - SCO (every boundary offloaded through the copy stream) vs standard checkpointing: the loss
//     and every gradient bitwise equal, and the `boundaries` peaks equal to their formulas (also
//     in bf16, on both backends);
//   - PipelinedLLEP (several chunks) vs the standard dispatcher, Ring-DTP (several strips, both
//     payloads) vs materialised logits, and all four bounded schedules at once vs all standard:
//     loss and gradients within f32 rounding (and all at once in bf16, within bf16's: the
//     schedules round bf16 activations at other points, so a whole model drifts by bf16 rounding
//     even with every sum in fp32; each schedule alone in bf16: tests/parallel/test_llep.cpp,
//     test_ring_dtp.cpp);
//   - gpt-oss's experts (random biases b1, b3, b2 and the clamped SwiGLU) through the dispatchers
//     themselves (the decoder does not run gpt-oss yet): StandardDispatch against the float64
//     host reference (tests/moe_reference.h) and PipelinedLLEP (several chunks, F in blocks)
//     against StandardDispatch — out, dx, dweight and every weight and bias gradient; f32 with a
//     clamp that binds (limit 0.5), bf16 with gpt-oss's limit 7 (bf16 would flip the clamp's
//     gradient masks against f64 where it binds: tests/parallel/test_llep_gpt_oss.cpp measures that
//     on the CPU);
//   - OffloadStreamAdamW (several buckets, 2 and 3 staging slots) and the serial CPU offload vs
//     resident AdamW over three steps: weights, m and v bitwise equal, the `optimizer` peaks equal
//     to adamw_resident_bytes and adamw_offload_stream_bytes; also with bf16 working
//     weights and an fp32 master (resident's on the device, the offloads' pinned on the host;
//     the serial offload's host AdamW rounds to bf16 on the host): master, m, v and the bf16
//     weights bitwise equal.
// On CUDA this is the "schedules on streams" check; with MOEPEAK_BACKEND_OPS=cpu it
// checks itself on the CPU backend (test_backend_ops_cpu).
//
//   build/tests/ops/test_backend_ops --gtest_filter='BackendSchedules.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/optimizer_params.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/checkpoint_sco.h"
#include "ops/schedules/checkpoint_standard.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/schedule_dtype.h"
#include "ops/swiglu.h"
#include "tests/moe_reference.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {
namespace {

constexpr int64_t kBatch = 2, kSeq = 32, kTokens = kBatch * kSeq;

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 61;
  m.hidden_size = 32;
  m.intermediate_size = 40;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  m.initializer_range = 0.5;  // routing far from ties, so every schedule picks the same experts
  m.router_aux_loss_coef = 0.02;
  return m;
}

struct Step {
  double loss = 0;
  std::vector<double> grads;
  MemoryStats stats;
  int64_t offloaded = 0;  // SCO's offloaded layers
};

// One forward + backward of the tiny model under `schedules` on `backend`, from seeded weights,
// in f32 or (CUDA) bf16; bf16 starts from smaller weights (range 0.1, as model_check.cpp: the
// range-0.5 model's gain amplifies bf16's rounding).
Step model_step(Backend& backend, const SchedulesConfig& schedules, DType dtype = DType::f32) {
  Stream& stream = backend.default_stream();
  std::unique_ptr<Comm> comm = make_comm(backend, RankInfo{});
  const ModelConfig m = tiny_model();
  std::vector<int64_t> ids(kTokens), labels(kTokens), positions(kTokens);
  int64_t scored = 0;
  for (int64_t n = 0; n < kTokens; ++n) {
    ids[n] = (n * 23 + 7) % m.vocab_size;
    labels[n] = n % 9 == 4 ? -100 : (n * 13 + 3) % m.vocab_size;
    positions[n] = n % kSeq;
    scored += labels[n] != -100;
  }
  auto upload = [&](const std::vector<int64_t>& v, const char* what) {
    auto t = OwnedTensor::device(backend, Shape{kTokens}, DType::i64, LiveSet::workspace, what);
    backend.copy_async(t.data(), v.data(), kTokens * 8, CopyKind::host_to_device, stream);
    return t;
  };
  OwnedTensor d_ids = upload(ids, "ids"), d_labels = upload(labels, "labels"),
              d_positions = upload(positions, "positions");
  stream.synchronize();

  DecoderModel model(backend, stream, *comm, m, schedules, dtype);
  model.params().initialize(7, dtype == DType::bf16 ? 0.1 : m.initializer_range, stream);
  model.params().zero_grads(stream);
  stream.synchronize();
  backend.arena().reset_peaks();
  Step step;
  step.loss = model.forward_backward(TokenBatch{d_ids, d_labels, d_positions, kBatch, kSeq, scored},
                                     scored);
  step.stats = backend.arena().stats();
  step.grads = copy_to_host_as_double(model.params().flat_grads(), backend, stream);
  if (auto* sco = dynamic_cast<schedules::ScoBoundaries*>(&model.boundaries())) {
    step.offloaded = sco->offloaded_layers();
  }
  return step;
}

// max |got - want| over max |want|, infinite on a NaN.
double scaled_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

SchedulesConfig standard_schedules() { return SchedulesConfig{}; }

class BackendSco : public ::testing::TestWithParam<DType> {};

TEST_P(BackendSco, IsBitwiseStandardCheckpointingWithinItsBound) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const DType dtype = GetParam();
  Backend& backend = backend_under_test();
  const Step standard = model_step(backend, standard_schedules(), dtype);
  SchedulesConfig s = standard_schedules();
  s.checkpoint = CheckpointSchedule::sco;
  s.sco_host_budget = std::to_string(1ull << 30);  // every layer's boundary fits
  const Step sco = model_step(backend, s, dtype);
  const ModelConfig m = tiny_model();
  const int64_t L = m.num_hidden_layers, H = m.hidden_size;
  EXPECT_EQ(sco.offloaded, L);
  EXPECT_EQ(sco.loss, standard.loss);
  EXPECT_EQ(sco.grads, standard.grads) << "SCO's gradients differ from standard checkpointing's";
  EXPECT_EQ(standard.stats.peak_per_set()[LiveSet::boundaries],
            schedules::boundaries_standard_bytes(L, kTokens, H, dtype));
  EXPECT_EQ(sco.stats.peak_per_set()[LiveSet::boundaries],
            schedules::sco_boundaries_bytes(L, sco.offloaded, kTokens, H, dtype));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendSco, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

struct BoundedCase {
  std::string name;
  SchedulesConfig schedules;
  DType dtype = DType::f32;
};

std::vector<BoundedCase> bounded_cases() {
  std::vector<BoundedCase> cases;
  SchedulesConfig s = standard_schedules();
  s.dispatch = DispatchSchedule::pipelined_llep;
  s.chunk_tokens = 16;  // 4 chunks of the 64 tokens
  cases.push_back({"pipelined_llep", s});
  for (VocabPayload payload : {VocabPayload::activations, VocabPayload::weights}) {
    s = standard_schedules();
    s.vocab = VocabSchedule::ring_dtp;
    s.ring_payload = payload;
    s.vocab_strip = 16;  // 4 strips of the 61 columns
    cases.push_back({std::string("ring_dtp_") + std::string(enum_name(payload)), s});
  }
  s.dispatch = DispatchSchedule::pipelined_llep;
  s.chunk_tokens = 16;
  s.checkpoint = CheckpointSchedule::sco;
  s.sco_host_budget = std::to_string(1ull << 30);
  s.vocab_kept_strips = 2;  // the first 2 of the 4 strips go from forward to backward
  cases.push_back({"all_bounded", s});
  cases.push_back({"all_bounded_bf16", s, DType::bf16});
  return cases;
}

class BackendBoundedSchedule : public ::testing::TestWithParam<BoundedCase> {};

TEST_P(BackendBoundedSchedule, MatchesTheStandardScheduleInFloat32) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const DType dtype = GetParam().dtype;
  Backend& backend = backend_under_test();
  const Step standard = model_step(backend, standard_schedules(), dtype);
  const Step bounded = model_step(backend, GetParam().schedules, dtype);
  EXPECT_GT(standard.loss, 1.0);
  // NOTES: the bounded schedules sum the same products in other groupings (chunks, strips, an
  // online log-sum-exp), so they agree with the standard ones to f32 rounding, not bitwise; in
  // bf16 each grouping rounds its stored partial results to bf16 (~4e-3 relative).
  const bool bf16 = dtype == DType::bf16;
  EXPECT_NEAR(bounded.loss, standard.loss, (bf16 ? 2e-3 : 1e-5) * standard.loss);
  ASSERT_EQ(bounded.grads.size(), standard.grads.size());
  const double err = scaled_error(bounded.grads, standard.grads);
  std::printf("  %s: loss %.9f vs %.9f; gradients max error %.2e of the largest\n",
              GetParam().name.c_str(), bounded.loss, standard.loss, err);
  EXPECT_LE(err, bf16 ? 3e-2 : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Schedules, BackendBoundedSchedule, ::testing::ValuesIn(bounded_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- gpt-oss experts through the dispatchers
// ------------------------------------------------------

constexpr int64_t kExpertTokens = 40, kExpertHidden = 64, kExpertFfn = 160, kExperts = 4, kTopK = 2;

// One MoE layer's inputs in doubles, the fields tests/moe_reference.h reads.
struct ExpertProblem {
  std::vector<double> x, weight, dout, out0, dx0;
  std::vector<int64_t> index;
  std::vector<std::vector<double>> w1, w2, w3, dw1, dw2, dw3, b1, b2, b3, db1, db2, db3;
};

ExpertProblem expert_problem(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0), pos(0.1, 1.0);
  auto vec = [&](int64_t n, double scale) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& e : v) e = scale * uni(rng);
    return v;
  };
  const int64_t N = kExpertTokens, H = kExpertHidden, F = kExpertFfn;
  ExpertProblem p;
  p.x = vec(N * H, 1.0);
  p.dout = vec(N * H, 1.0);
  p.out0 = vec(N * H, 0.5);
  p.dx0 = vec(N * H, 0.5);
  for (int64_t e = 0; e < kExperts; ++e) {
    p.w1.push_back(vec(F * H, 1.0 / std::sqrt(double(H))));
    p.w3.push_back(vec(F * H, 1.0 / std::sqrt(double(H))));
    p.w2.push_back(vec(H * F, 1.0 / std::sqrt(double(F))));
    p.dw1.push_back(vec(F * H, 0.1));
    p.dw3.push_back(vec(F * H, 0.1));
    p.dw2.push_back(vec(H * F, 0.1));
    p.b1.push_back(vec(F, 0.5));
    p.b3.push_back(vec(F, 0.5));
    p.b2.push_back(vec(H, 0.5));
    p.db1.push_back(vec(F, 0.1));
    p.db3.push_back(vec(F, 0.1));
    p.db2.push_back(vec(H, 0.1));
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t first = static_cast<int64_t>(rng() % kExperts);
    const int64_t second = (first + 1 + static_cast<int64_t>(rng() % (kExperts - 1))) % kExperts;
    const double w0 = pos(rng), w1 = pos(rng);
    p.index.insert(p.index.end(), {first, second});
    p.weight.insert(p.weight.end(), {w0 / (w0 + w1), w1 / (w0 + w1)});
  }
  return p;
}

struct ExpertRun {
  std::vector<double> out, dx, dweight;
  std::vector<std::vector<double>> grads;  // per expert: dw1, dw3, dw2, db1, db3, db2
  int64_t chunks = 0, ffn_blocks = 0;      // PipelinedLLEP's shape
};

// Forward and backward of one dispatcher over `p` on `backend` (W = 1): out, dx and the
// gradients start from p's values (+=), dweight is poisoned with NaN (=).
ExpertRun run_experts(Backend& backend, const ExpertProblem& p, DType dtype,
                      const ops::SwigluParams& activation, bool pipelined) {
  Stream& stream = backend.default_stream();
  std::unique_ptr<Comm> comm = make_comm(backend, RankInfo{});
  const int64_t N = kExpertTokens, H = kExpertHidden, F = kExpertFfn;
  const DType grad = schedules::main_grad_dtype(dtype);
  std::vector<OwnedTensor> keep;
  auto upload = [&](const std::vector<double>& v, Shape shape, DType dt) {
    keep.push_back(OwnedTensor::device(backend, shape, dt, LiveSet::workspace, "expert test"));
    copy_from_host_as(v, keep.back(), backend, stream);
    return keep.back().view();
  };
  std::vector<schedules::ExpertWeights> experts(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    schedules::ExpertWeights& w = experts[static_cast<size_t>(e)];
    w.w1 = upload(p.w1[e], Shape{F, H}, dtype);
    w.w3 = upload(p.w3[e], Shape{F, H}, dtype);
    w.w2 = upload(p.w2[e], Shape{H, F}, dtype);
    w.dw1 = upload(p.dw1[e], Shape{F, H}, grad);
    w.dw3 = upload(p.dw3[e], Shape{F, H}, grad);
    w.dw2 = upload(p.dw2[e], Shape{H, F}, grad);
    w.b1 = upload(p.b1[e], Shape{F}, dtype);
    w.b3 = upload(p.b3[e], Shape{F}, dtype);
    w.b2 = upload(p.b2[e], Shape{H}, dtype);
    w.db1 = upload(p.db1[e], Shape{F}, grad);
    w.db3 = upload(p.db3[e], Shape{F}, grad);
    w.db2 = upload(p.db2[e], Shape{H}, grad);
  }
  std::vector<double> index(p.index.begin(), p.index.end());
  const Tensor x = upload(p.x, Shape{N, H}, dtype), dout = upload(p.dout, Shape{N, H}, dtype);
  const Tensor weight = upload(p.weight, Shape{N, kTopK}, dtype);
  const Tensor idx = upload(index, Shape{N, kTopK}, DType::i32);
  const Tensor out = upload(p.out0, Shape{N, H}, dtype), dx = upload(p.dx0, Shape{N, H}, dtype);
  const Tensor dweight = upload(std::vector<double>(N * kTopK, NAN), Shape{N, kTopK}, dtype);
  std::unique_ptr<schedules::ExpertDispatch> dispatch;
  schedules::PipelinedLlepDispatch* pipeline = nullptr;
  if (pipelined) {
    schedules::PipelinedLlepParams q;
    q.chunk_tokens = 8;  // 5 chunks of the 40 tokens
    q.min_tokens_per_gemm = 2;
    auto d = std::make_unique<schedules::PipelinedLlepDispatch>(backend, stream, *comm, dtype,
                                                                kExperts, q, nullptr, activation);
    pipeline = d.get();
    dispatch = std::move(d);
  } else {
    dispatch = std::make_unique<schedules::StandardDispatch>(backend, stream, dtype, activation);
  }
  dispatch->forward(x, idx, weight, experts, out);
  dispatch->backward(dout, experts, dx, dweight);
  ExpertRun r;
  if (pipeline) {
    r.chunks = pipeline->shape().chunks;
    r.ffn_blocks = pipeline->shape().ffn_blocks;
  }
  r.out = copy_to_host_as_double(out, backend, stream);
  r.dx = copy_to_host_as_double(dx, backend, stream);
  r.dweight = copy_to_host_as_double(dweight, backend, stream);
  for (const schedules::ExpertWeights& w : experts) {
    std::vector<double> all;
    for (const Tensor* t : {&w.dw1, &w.dw3, &w.dw2, &w.db1, &w.db3, &w.db2}) {
      const std::vector<double> part = copy_to_host_as_double(*t, backend, stream);
      all.insert(all.end(), part.begin(), part.end());
    }
    r.grads.push_back(std::move(all));
  }
  return r;
}

// The largest scaled_error over out, dx, dweight and every expert's gradients.
double expert_error(const ExpertRun& got, const std::vector<double>& out,
                    const std::vector<double>& dx, const std::vector<double>& dweight,
                    const std::vector<std::vector<double>>& grads) {
  double err = std::max(
      {scaled_error(got.out, out), scaled_error(got.dx, dx), scaled_error(got.dweight, dweight)});
  for (size_t e = 0; e < grads.size(); ++e)
    err = std::max(err, scaled_error(got.grads[e], grads[e]));
  return err;
}

class BackendGptOssExperts : public ::testing::TestWithParam<DType> {};

TEST_P(BackendGptOssExperts, StandardMatchesFloat64AndPipelinedMatchesStandard) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const DType dtype = GetParam();
  const bool bf16 = dtype == DType::bf16;
  Backend& backend = backend_under_test();
  // f32: a clamp that binds (a, b of order 0.5 to 1); bf16: gpt-oss's limit 7, which these never
  // reach (see the file comment).
  const ops::SwigluParams act =
      bf16 ? ops::SwigluParams::gpt_oss() : ops::SwigluParams::gpt_oss(0.5, 1.702);
  const ExpertProblem p = expert_problem(17);
  const test_support::MoeReference exact =
      test_support::moe_reference(p, kExpertTokens, kExpertHidden, kExpertFfn, kTopK, true, act);
  if (!bf16) {
    EXPECT_GE(exact.a_clamped, 0.1);
    EXPECT_GE(exact.b_clamped, 0.1);
  }
  const ExpertRun standard = run_experts(backend, p, dtype, act, false);
  const ExpertRun pipelined = run_experts(backend, p, dtype, act, true);
  EXPECT_GE(pipelined.chunks, 2);
  EXPECT_GE(pipelined.ffn_blocks, 2) << "the expert MLP blocked over F (b2 once, not per block)";
  const double vs64 = expert_error(standard, exact.out, exact.dx, exact.dweight, exact.grads);
  const double vs_standard =
      expert_error(pipelined, standard.out, standard.dx, standard.dweight, standard.grads);
  std::printf(
      "  gpt-oss experts %s: standard vs float64 %.2e, pipelined llep vs standard %.2e "
      "(clamped: a %.0f%%, b %.0f%%)\n",
      std::string(dtype_name(dtype)).c_str(), vs64, vs_standard, 100 * exact.a_clamped,
      100 * exact.b_clamped);
  // NOTES: f32 — GEMMs (and on CUDA, cuBLAS's kernels) sum H or F products in other orders than
  // the reference's loops, and PipelinedLLEP sums F in blocks: rounding of f32 only (measured
  // <= 1.8e-7 on the CPU). bf16 — a, b, g and y are rounded to bf16 (~4e-3 each), and the two
  // schedules round at different points (per F block against per expert): measured 6.3e-3 and
  // 1.1e-2 on the CPU.
  EXPECT_LE(vs64, bf16 ? 3e-2 : 1e-5);
  EXPECT_LE(vs_standard, bf16 ? 0x1p-6 : 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendGptOssExperts, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- AdamW placements ---------------------------------------------------------------------------

struct AdamwResult {
  std::vector<char> weights, m, v, master;  // master: only with bf16 working weights
  uint64_t optimizer_peak = 0;
};

std::vector<char> state_bytes(const schedules::Optimizer& o, const char* name, Backend& backend) {
  for (const auto& s : o.state()) {
    if (s.name == name) return copy_to_host(s.flat, backend, backend.default_stream());
  }
  return {};
}

// Three steps of `make(params)` from the weights in `initial` with the model's gradients.
template <typename Make>
AdamwResult run_adamw(Backend& backend, ZeroParamStore& params, const std::vector<char>& initial,
                      Make&& make) {
  Stream& stream = backend.default_stream();
  const Tensor values = params.flat_values();
  backend.copy_async(values.data(), initial.data(), initial.size(), CopyKind::host_to_device,
                     stream);
  stream.synchronize();
  backend.arena().reset_peaks();
  AdamwResult r;
  {
    std::unique_ptr<schedules::Optimizer> opt = make(params);
    for (int64_t step = 1; step <= 3; ++step) opt->step(step, 1e-2, step == 2 ? 0.5 : 1.0, stream);
    stream.synchronize();
    r.m = state_bytes(*opt, "exp_avg", backend);
    r.v = state_bytes(*opt, "exp_avg_sq", backend);
    r.master = state_bytes(*opt, "master", backend);
  }
  r.optimizer_peak = backend.arena().stats().peak_per_set()[LiveSet::optimizer];
  r.weights = copy_to_host(values, backend, stream);
  return r;
}

bool same_state(const AdamwResult& a, const AdamwResult& b) {
  return a.weights == b.weights && a.m == b.m && a.v == b.v && a.master == b.master;
}

// f32 working weights (the master) or bf16 working weights with an fp32 master.
class BackendAdamW : public ::testing::TestWithParam<DType> {};

TEST_P(BackendAdamW, OffloadedPlacementsAreBitwiseResident) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const DType dtype = GetParam();
  Backend& backend = backend_under_test();
  Stream& stream = backend.default_stream();
  std::unique_ptr<Comm> comm = make_comm(backend, RankInfo{});
  DecoderModel model(backend, stream, *comm, tiny_model(), standard_schedules(), dtype);
  ZeroParamStore& params = model.params();
  params.initialize(11, 0.5, stream);
  // Gradients: seeded values of a realistic spread (some zero, some large).
  std::vector<double> grads(static_cast<size_t>(params.flat_grads().numel()));
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i] = i % 97 == 0 ? 0.0 : std::sin(0.37 * static_cast<double>(i)) * (1 + i % 5);
  }
  copy_from_host_as(grads, params.flat_grads(), backend, stream);
  const std::vector<char> initial = copy_to_host(params.flat_values(), backend, stream);
  const int64_t P = params.flat_values().numel();
  OptimizerConfig config;

  const AdamwResult resident = run_adamw(backend, params, initial, [&](ZeroParamStore& p) {
    return std::make_unique<schedules::ResidentAdamW>(backend, optimizer_params(p), config);
  });
  EXPECT_EQ(resident.optimizer_peak, schedules::adamw_resident_bytes(P, dtype));
  EXPECT_EQ(resident.master.empty(), dtype != DType::bf16) << "an fp32 master with bf16 weights";
  // With bf16 weights the host AdamW rounds the new master as the device's adamw_fused does.
  const AdamwResult serial = run_adamw(backend, params, initial, [&](ZeroParamStore& p) {
    return std::make_unique<schedules::SerialOffloadAdamW>(backend, optimizer_params(p), config, 2);
  });
  EXPECT_TRUE(same_state(serial, resident))
      << "the serial CPU offload is not bitwise resident AdamW";
  EXPECT_EQ(serial.optimizer_peak, 0u) << "the serial offload keeps nothing on the device";
  for (int64_t slots : {2, 3}) {
    OptimizerConfig c = config;
    c.bucket_params = 1000;  // several buckets of the model's parameters
    c.staging_slots = slots;
    uint64_t staging = 0;
    const AdamwResult stream_result = run_adamw(backend, params, initial, [&](ZeroParamStore& p) {
      auto opt = std::make_unique<schedules::OffloadStreamAdamW>(backend, optimizer_params(p), c);
      EXPECT_GT(opt->shape().buckets, slots);
      staging = opt->staging_bytes();
      return opt;
    });
    EXPECT_TRUE(same_state(stream_result, resident))
        << "OffloadStreamAdamW with " << slots << " slots is not bitwise resident AdamW";
    EXPECT_EQ(staging, schedules::adamw_offload_stream_bytes(
                           std::min<int64_t>(1000, P), std::min<int64_t>(slots, (P + 999) / 1000),
                           DType::f32));
    EXPECT_EQ(stream_result.optimizer_peak, staging) << slots << " slots";
  }
  EXPECT_NE(resident.weights, initial) << "the steps changed nothing";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendAdamW, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace moepeak::testing::backend_ops
