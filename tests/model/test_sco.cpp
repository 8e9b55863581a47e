// SCO (selective checkpoint offload, ops/schedules/checkpoint_sco.h) in the whole Mixtral model on
// one rank, against standard checkpointing:
//   - the sizing functions: the offload set is the longest prefix of layers that fits the host
//     budget, "auto" is what the pinned pool can still give, the bytes formulas;
//   - losses and every gradient bitwise equal to standard checkpointing (the very bytes come back),
//     over two steps with fresh random batches, for no / some / all layers offloaded and "auto";
//   - the measured peaks — device `boundaries` (arena) and host `boundaries` (pinned pool) —
//     equal to sco_boundaries_bytes / sco_host_bytes, every other live set as under standard;
//   - still bitwise equal with the copy stream, or the compute stream, slowed on purpose (a
//     device buffer freed before its copy to host finished, or a copy not ordered after the work
//     it reads or overwrites, shows up there as wrong gradients);
//   - evaluation (forward_loss) offloads nothing; a host budget the pinned pool cannot give is
//     a clear error.
// Run: ctest -R test_sco
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "core/model/decoder.h"
#include "core/runtime/cpu_stream.h"
#include "core/units.h"
#include "ops/schedules/checkpoint_sco.h"

namespace moepeak {
namespace {

using schedules::sco_boundaries_bytes;
using schedules::sco_host_bytes;

constexpr DType f32 = DType::f32;

ModelConfig model_config(int64_t hidden) {
  ModelConfig m;
  m.vocab_size = 96;
  m.hidden_size = hidden;
  m.intermediate_size = hidden;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = hidden / 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 512;
  return m;
}

// Two shapes. `small`: a boundary is 60 x 32 f32 = 7.5 KiB, so every layer fits one 2 MiB pinned
// block. `wide`: 3072 x 64 f32 = 768 KiB, so two layers fit 2 MiB and three need 4 MiB — a
// budget of 2 MiB offloads two of the three layers and keeps the last on device.
struct ModelShape {
  int64_t hidden, batch, seq_len;
};
constexpr ModelShape kSmall{32, 3, 20};
constexpr ModelShape kWide{64, 16, 192};

struct Harness {
  ModelConfig cfg;
  std::unique_ptr<Backend> backend;
  Stream& stream;
  std::unique_ptr<Comm> comm;
  int64_t B, T, N;

  Harness(const ModelShape& shape, uint64_t pinned_budget)
      : cfg(model_config(shape.hidden)),
        backend(make_backend(pinned_budget)),
        stream(backend->default_stream()),
        comm(make_comm(*backend, RankInfo{})),
        B(shape.batch),
        T(shape.seq_len),
        N(shape.batch * shape.seq_len) {}

  static std::unique_ptr<Backend> make_backend(uint64_t pinned_budget) {
    BackendOptions o;
    o.pinned_budget = pinned_budget;
    return Backend::create(o);
  }

  // A fresh random batch (about one label in seven not scored).
  struct Batch {
    OwnedTensor ids, labels, positions;
    int64_t scored = 0;
  };
  Batch make_batch(uint64_t seed) const {
    Batch b;
    b.ids = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "ids");
    b.labels = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
    b.positions =
        OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> token(0, cfg.vocab_size - 1);
    for (int64_t n = 0; n < N; ++n) {
      b.ids.data_as<int64_t>()[n] = token(rng);
      const int64_t label = token(rng);
      b.labels.data_as<int64_t>()[n] = label % 7 == 3 ? -100 : label;
      b.positions.data_as<int64_t>()[n] = n % T;
      b.scored += b.labels.data_as<int64_t>()[n] != -100;
    }
    return b;
  }
  TokenBatch token_batch(const Batch& b) const {
    return TokenBatch{b.ids, b.labels, b.positions, B, T, b.scored};
  }
};

SchedulesConfig schedules_with(CheckpointSchedule checkpoint,
                               const std::string& host_budget = "auto") {
  SchedulesConfig s;
  s.checkpoint = checkpoint;
  s.sco_host_budget = host_budget;
  return s;
}

// One model's steps: each step's loss and gradients (zeroed before each step), the peaks of the
// last step, and |S| under SCO.
struct Steps {
  std::vector<double> losses;
  std::vector<std::vector<char>> grads;
  MemoryStats device, host;
  int64_t offloaded = -1;
};

Steps run_steps(Harness& h, const SchedulesConfig& schedules, int steps,
                const std::function<void(DecoderModel&)>& before = {}) {
  DecoderModel model(*h.backend, h.stream, *h.comm, h.cfg, schedules, f32);
  model.params().initialize(11, 0.1, h.stream);
  if (before) before(model);
  Steps out;
  for (int step = 0; step < steps; ++step) {
    const Harness::Batch batch = h.make_batch(100 + static_cast<uint64_t>(step));
    model.params().zero_grads(h.stream);
    h.backend->arena().reset_peaks();
    h.backend->pinned().reset_peaks();
    out.losses.push_back(model.forward_backward(h.token_batch(batch), batch.scored));
    const Tensor g = model.params().flat_grads();
    out.grads.emplace_back(static_cast<char*>(g.data()), static_cast<char*>(g.data()) + g.nbytes());
    out.device = h.backend->arena().stats();
    out.host = h.backend->pinned().stats();
  }
  if (auto* sco = dynamic_cast<schedules::ScoBoundaries*>(&model.boundaries())) {
    out.offloaded = sco->offloaded_layers();
  }
  return out;
}

void expect_bitwise_equal(const Steps& reference, const Steps& sco) {
  ASSERT_EQ(reference.losses.size(), sco.losses.size());
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    EXPECT_EQ(reference.losses[i], sco.losses[i]) << "loss of step " << i;
    EXPECT_TRUE(reference.grads[i] == sco.grads[i]) << "gradients of step " << i << " differ";
  }
}

// ---- The sizing functions -----------------------------------------------------------------------

TEST(ScoBytes, OffloadSetIsTheLongestPrefixOfLayersThatFitsTheBudget) {
  const int64_t L = 6, N = 1536, H = 128;  // 768 KiB per boundary
  const uint64_t two_mib = 2 * MiB;
  EXPECT_EQ(sco_host_bytes(0, N, H, f32), 0u);
  EXPECT_EQ(sco_host_bytes(1, N, H, f32), two_mib);
  EXPECT_EQ(sco_host_bytes(2, N, H, f32), two_mib);      // 1.5 MiB in one block
  EXPECT_EQ(sco_host_bytes(3, N, H, f32), 2 * two_mib);  // 2.25 MiB
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, 0), 0);
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, two_mib - 1), 0);
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, two_mib), 2);
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, 4 * MiB), 5);  // 3.75 MiB
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, 6 * MiB), 6);
  EXPECT_EQ(schedules::sco_offloaded_layers(L, N, H, f32, 64 * GiB), L);
  const std::vector<bool> set = schedules::sco_offload_set(L, N, H, f32, two_mib);
  EXPECT_EQ(set, (std::vector<bool>{true, true, false, false, false, false}));
}

TEST(ScoBytes, BoundariesBytesAreTwoPlusTheKeptLayers) {
  const int64_t L = 8, N = 100, H = 24;  // 9600 bytes -> 9728 in the arena
  const uint64_t one = DeviceArena::footprint(N * H * 4);
  ASSERT_EQ(one, 9728u);
  const uint64_t standard = schedules::boundaries_standard_bytes(L, N, H, f32);
  EXPECT_EQ(standard, (L + 1) * one);
  EXPECT_EQ(sco_boundaries_bytes(L, 0, N, H, f32), standard);  // nothing offloaded = standard
  EXPECT_EQ(sco_boundaries_bytes(L, L, N, H, f32), 2 * one);   // every layer offloaded
  EXPECT_EQ(sco_boundaries_bytes(L, L - 1, N, H, f32), 2 * one);
  EXPECT_EQ(sco_boundaries_bytes(L, 3, N, H, f32), (L - 3 + 1) * one);
  // Every layer offloaded: at most 2/L of standard (which also counts the final hidden state).
  EXPECT_LE(sco_boundaries_bytes(L, L, N, H, f32) * L, 2 * standard);
}

TEST(ScoBytes, AutoBudgetIsWhatThePinnedPoolCanStillGive) {
  Harness h(kSmall, 8 * MiB);
  const PinnedPool& pool = h.backend->pinned();
  EXPECT_EQ(schedules::sco_host_budget(std::nullopt, pool), 8 * MiB);
  EXPECT_EQ(schedules::sco_host_budget(uint64_t{3 * MiB}, pool), 3 * MiB);  // configured bytes
  OwnedTensor held = OwnedTensor::pinned(*h.backend, Shape{1024}, f32, LiveSet::optimizer, "held");
  EXPECT_EQ(schedules::sco_host_budget(std::nullopt, pool), 6 * MiB);
  held.reset();  // cached by the pool, not in use: available again
  EXPECT_EQ(schedules::sco_host_budget(std::nullopt, pool), 8 * MiB);
}

// ---- The model under SCO ------------------------------------------------------------------------

struct BudgetCase {
  const char* name;
  ModelShape shape;
  std::string host_budget;  // schedules.sco_host_budget
  uint64_t pinned_budget;   // runtime.pinned_memory
  uint64_t held_pinned;     // pinned bytes another user holds during the steps
  int64_t offloaded;        // the |S| this gives
};

const BudgetCase kBudgetCases[] = {
    {"none", kWide, "0", 64 * MiB, 0, 0},
    {"below_one_block", kWide, "1MiB", 64 * MiB, 0, 0},
    {"two_of_three", kWide, "2MiB", 64 * MiB, 0, 2},
    {"all", kWide, "4MiB", 64 * MiB, 0, 3},
    {"all_small", kSmall, "16GiB", 64 * MiB, 0, 3},
    // auto: the 6 MiB pool less the 4 MiB another user holds = 2 MiB: two of three layers.
    {"auto", kWide, "auto", 6 * MiB, 4 * MiB, 2},
};

class ScoModel : public ::testing::TestWithParam<BudgetCase> {};

TEST_P(ScoModel, LossesAndGradientsAreBitwiseEqualToStandardCheckpointing) {
  const BudgetCase& c = GetParam();
  Harness h(c.shape, c.pinned_budget);
  OwnedTensor held;
  if (c.held_pinned > 0) {
    held = OwnedTensor::pinned(*h.backend, Shape{static_cast<int64_t>(c.held_pinned / 4)}, f32,
                               LiveSet::optimizer, "another user's pinned state");
  }
  const Steps standard = run_steps(h, schedules_with(CheckpointSchedule::standard), 2);
  const Steps sco = run_steps(h, schedules_with(CheckpointSchedule::sco, c.host_budget), 2);
  EXPECT_EQ(sco.offloaded, c.offloaded);
  expect_bitwise_equal(standard, sco);
}

TEST_P(ScoModel, MeasuredPeaksEqualTheBounds) {
  const BudgetCase& c = GetParam();
  Harness h(c.shape, c.pinned_budget);
  OwnedTensor held;
  if (c.held_pinned > 0) {
    held = OwnedTensor::pinned(*h.backend, Shape{static_cast<int64_t>(c.held_pinned / 4)}, f32,
                               LiveSet::optimizer, "another user's pinned state");
  }
  const int64_t L = h.cfg.num_hidden_layers, H = h.cfg.hidden_size;
  const Steps standard = run_steps(h, schedules_with(CheckpointSchedule::standard), 1);
  const Steps sco = run_steps(h, schedules_with(CheckpointSchedule::sco, c.host_budget), 1);
  ASSERT_EQ(sco.offloaded, c.offloaded);

  // Device: the boundaries live set is exactly the formula; it is what the schedule sizes with.
  EXPECT_EQ(standard.device.peak_per_set()[LiveSet::boundaries],
            schedules::boundaries_standard_bytes(L, h.N, H, f32));
  EXPECT_EQ(sco.device.peak_per_set()[LiveSet::boundaries],
            sco_boundaries_bytes(L, c.offloaded, h.N, H, f32));
  if (c.offloaded == L) {
    EXPECT_EQ(sco.device.peak_per_set()[LiveSet::boundaries],
              2 * DeviceArena::footprint(h.N * H * 4));
  }
  // Host: one pinned block for S, in the pool's `boundaries` set.
  EXPECT_EQ(sco.host.peak_per_set()[LiveSet::boundaries], sco_host_bytes(c.offloaded, h.N, H, f32));
  EXPECT_EQ(standard.host.peak_per_set()[LiveSet::boundaries], 0u);
  // Nothing outlives the step, on either side.
  EXPECT_EQ(sco.device.current()[LiveSet::boundaries], 0u);
  EXPECT_EQ(sco.host.current()[LiveSet::boundaries], 0u);
  // SCO moves no bytes into another live set.
  for (LiveSet s : {LiveSet::weights, LiveSet::grads, LiveSet::attention, LiveSet::dispatch,
                    LiveSet::logits, LiveSet::workspace}) {
    EXPECT_EQ(sco.device.peak_per_set()[s], standard.device.peak_per_set()[s]) << live_set_name(s);
  }
  EXPECT_LE(sco.device.peak_total(), standard.device.peak_total());
}

INSTANTIATE_TEST_SUITE_P(HostBudgets, ScoModel, ::testing::ValuesIn(kBudgetCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Races: a slowed stream must not change a bit -----------------------------------------------

enum class Slowed { copy_stream, compute_stream };

class ScoRace : public ::testing::TestWithParam<Slowed> {};

TEST_P(ScoRace, SlowedStreamStillGivesBitwiseEqualResults) {
  // NOTES: with the copy stream slowed, forward_done() must wait for the copy to host before it
  // frees the device buffer: freed at once, the next allocations (the next layer's norm, q, ...)
  // take its bytes and the compute stream overwrites them before the slow copy reads them, so the
  // backward recomputes from wrong inputs. With the compute stream slowed, the copies must wait
  // for it: a copy to host would read an input not yet written, a copy back would land in bytes
  // (the recompute's dropped output) the compute stream still writes.
  Harness h(kSmall, 64 * MiB);
  const Steps standard = run_steps(h, schedules_with(CheckpointSchedule::standard), 2);
  const bool slow_copy = GetParam() == Slowed::copy_stream;
  const Steps sco =
      run_steps(h, schedules_with(CheckpointSchedule::sco, "16GiB"), 2, [&](DecoderModel& m) {
        auto& sco_boundaries = dynamic_cast<schedules::ScoBoundaries&>(m.boundaries());
        Stream& slowed = slow_copy ? sco_boundaries.copy_stream() : h.stream;
        as_cpu_stream(slowed).set_debug_delay(std::chrono::microseconds(slow_copy ? 20000 : 1000));
      });
  as_cpu_stream(h.stream).set_debug_delay(std::chrono::microseconds(0));
  EXPECT_EQ(sco.offloaded, h.cfg.num_hidden_layers);
  expect_bitwise_equal(standard, sco);
}

INSTANTIATE_TEST_SUITE_P(Streams, ScoRace,
                         ::testing::Values(Slowed::copy_stream, Slowed::compute_stream),
                         [](const auto& info) {
                           return std::string(info.param == Slowed::copy_stream ? "copy"
                                                                                : "compute");
                         });

// ---- Evaluation and errors ----------------------------------------------------------------------

TEST(ScoModelEval, ForwardLossOffloadsNothingAndEqualsStandard) {
  Harness h(kWide, 64 * MiB);
  const Harness::Batch batch = h.make_batch(7);
  std::vector<double> losses;
  for (CheckpointSchedule c : {CheckpointSchedule::standard, CheckpointSchedule::sco}) {
    DecoderModel model(*h.backend, h.stream, *h.comm, h.cfg, schedules_with(c, "4MiB"), f32);
    model.params().initialize(11, 0.1, h.stream);
    h.backend->arena().reset_peaks();
    h.backend->pinned().reset_peaks();
    losses.push_back(model.forward_loss(h.token_batch(batch), batch.scored));
    EXPECT_EQ(h.backend->pinned().stats().peak_total(), 0u);
    // One input and one output at a time, as without checkpointing.
    EXPECT_EQ(h.backend->arena().stats().peak_per_set()[LiveSet::boundaries],
              2 * DeviceArena::footprint(h.N * h.cfg.hidden_size * 4));
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(ScoModelEval, HostBudgetThePinnedPoolCannotGiveIsAClearError) {
  Harness h(kWide, 2 * MiB);
  const Harness::Batch batch = h.make_batch(7);
  DecoderModel model(*h.backend, h.stream, *h.comm, h.cfg,
                     schedules_with(CheckpointSchedule::sco, "16GiB"), f32);
  model.params().initialize(11, 0.1, h.stream);
  try {
    model.forward_backward(h.token_batch(batch), batch.scored);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("schedules.sco_host_budget"), std::string::npos) << m;
    EXPECT_NE(m.find("runtime.pinned_memory"), std::string::npos) << m;
  }
  // Nothing was left behind.
  EXPECT_EQ(h.backend->pinned().stats().current_total(), 0u);
  EXPECT_EQ(h.backend->arena().stats().current()[LiveSet::boundaries], 0u);
}

}  // namespace
}  // namespace moepeak
