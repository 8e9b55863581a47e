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
