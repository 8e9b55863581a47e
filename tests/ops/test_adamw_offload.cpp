// The three AdamW placements on one rank (ops/schedules/optimizer.h), each against resident
// AdamW over the same model, init and gradients:
//   - offload_stream and offload_serial: after 5 steps (weight decay on all but the norms, bias
//     correction, a clip factor below 1 on some steps, a changing learning rate) the working
//     weights, m and v are bitwise resident's, and the host master equals the working weights —
//     f32 and f64, for buckets that split pieces (beta = 7, 64, 1000, P - 1, all of P) and
//     s = 2, 3, 5 slots;
//   - with each of the three pipeline streams slowed on purpose (set_debug_delay), the result
//     is still bitwise resident's: every wait (slot reuse after write-back included) is in place;
//   - memory: the measured `optimizer` peak on the device equals adamw_offload_stream_bytes of
//     the shape, exactly, and is released after the step; the pinned pool holds
//     adamw_offload_host_bytes in `optimizer` (the serial offload: 0 device bytes, its gradient
//     copy in `grads`); resident's equals adamw_resident_bytes;
//   - the bound is real: a device with room for the weights, grads and one shape of staging runs
//     that shape and throws out-of-memory, naming the staging slot, for a larger bucket;
//   - bf16 working weights (a bf16 run's: fp32 master, m, v and gradients): the serial offload's
//     host AdamW rounds the new master to bf16 as adamw_fused does, so it and offload_stream give
//     resident's weights, master, m and v bitwise; the serial offload's pinned bf16 weight copy
//     is adamw_offload_serial_weight_bytes in `weights` (0 for f32 weights);
//   - state() lists exp_avg and exp_avg_sq with their placement; load_master_from_weights copies;
//   - offload_stream_shape: numbers and errors naming the keys; the config keys
//     optimizer.bucket_params (formerly bucket_elements) and staging_slots are range-checked.
// Run: ctest -R test_adamw_offload --output-on-failure
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/error.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "core/runtime/pinned_pool.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "tests/expect_contains.h"

namespace moepeak {
namespace {

ModelConfig model_config() {
  ModelConfig m;
  m.vocab_size = 11;
  m.hidden_size = 7;  // odd sizes: pieces are padded to 64 elements in the flat buffer
  m.intermediate_size = 6;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  return m;
}

OptimizerConfig optimizer_config(OptimizerPlacement placement, int64_t bucket = 1 << 20,
                                 int64_t slots = 3) {
  OptimizerConfig o;
  o.weight_decay = 0.1;
  o.placement = placement;
  o.bucket_params = bucket;
  o.staging_slots = slots;
  return o;
}

template <typename T>
DType dtype_for() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

// A model's weights with one optimizer over them, trained by run_steps.
struct Trained {
  std::unique_ptr<ParamStore> params;
  std::unique_ptr<schedules::Optimizer> optimizer;
};

Trained make_trained(Backend& backend, DType dtype, const OptimizerConfig& config,
                     int host_threads = 2) {
  Trained r;
  r.params = std::make_unique<ParamStore>(backend, model_config(), dtype);
  r.params->initialize(5, 0.5, backend.default_stream());
  r.optimizer =
      schedules::make_optimizer(backend, optimizer_params(*r.params), config, host_threads);
  return r;
}

// Fresh random gradients (never zero) for every parameter; the same for a given step.
template <typename T>
void set_grads(const ParamStore& params, int step) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(step));
  std::normal_distribution<double> normal(0.0, 0.05);
  for (size_t i = 0; i < params.layout().params().size(); ++i) {
    Tensor g = params.grad(static_cast<int>(i));
    T* d = static_cast<T*>(g.data());
    for (int64_t j = 0; j < g.numel(); ++j) d[j] = static_cast<T>(normal(rng) + 1e-3);
  }
}

// Steps 1..steps with a changing learning rate and a clip factor below 1 on even steps.
template <typename T>
void run_steps(Backend& backend, Trained& r, int steps) {
  Stream& stream = backend.default_stream();
  for (int step = 1; step <= steps; ++step) {
    set_grads<T>(*r.params, step);
    const double lr = 1e-2 * (1.0 - 0.1 * step);
    const double clip = step % 2 == 0 ? 0.37 : 1.0;
    r.optimizer->step(step, lr, clip, stream);
    stream.synchronize();
  }
}

std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data());
  return std::vector<char>(p, p + t.nbytes());
}

Tensor state_of(const schedules::Optimizer& o, const std::string& name) {
  for (const auto& s : o.state()) {
    if (s.name == name) return s.flat;
  }
  ADD_FAILURE() << "no state " << name;
  return {};
}

// Weights, m and v of `got` are bitwise those of `want`.
void expect_same_state(const Trained& got, const Trained& want, const std::string& what) {
  EXPECT_EQ(bytes_of(got.params->flat_values()), bytes_of(want.params->flat_values()))
      << what << ": weights differ";
  for (const char* s : {"exp_avg", "exp_avg_sq"}) {
    EXPECT_EQ(bytes_of(state_of(*got.optimizer, s)), bytes_of(state_of(*want.optimizer, s)))
        << what << ": " << s << " differs";
  }
}

template <typename T>
void offload_is_bitwise_resident() {
  auto backend = Backend::create(BackendOptions{});
  const DType dt = dtype_for<T>();
  constexpr int kSteps = 5;
  Trained resident = make_trained(*backend, dt, optimizer_config(OptimizerPlacement::resident));
  run_steps<T>(*backend, resident, kSteps);
  const int64_t P = resident.params->flat_values().numel();

  Trained serial = make_trained(*backend, dt, optimizer_config(OptimizerPlacement::offload_serial));
  run_steps<T>(*backend, serial, kSteps);
  expect_same_state(serial, resident, "offload_serial");
  auto* s = dynamic_cast<schedules::SerialOffloadAdamW*>(serial.optimizer.get());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(bytes_of(s->master()), bytes_of(serial.params->flat_values()));

  for (int64_t bucket : {int64_t{7}, int64_t{64}, int64_t{1000}, P - 1, P, int64_t{1} << 20}) {
    for (int64_t slots : {2, 3, 5}) {
      Trained stream = make_trained(
          *backend, dt, optimizer_config(OptimizerPlacement::offload_stream, bucket, slots));
      run_steps<T>(*backend, stream, kSteps);
      const std::string what =
          "offload_stream beta " + std::to_string(bucket) + " s " + std::to_string(slots);
      expect_same_state(stream, resident, what);
      auto* o = dynamic_cast<schedules::OffloadStreamAdamW*>(stream.optimizer.get());
      ASSERT_NE(o, nullptr);
      EXPECT_EQ(bytes_of(o->master()), bytes_of(stream.params->flat_values())) << what;
    }
  }
}

TEST(AdamWOffload, SerialAndStreamAreBitwiseResidentF32) { offload_is_bitwise_resident<float>(); }
TEST(AdamWOffload, SerialAndStreamAreBitwiseResidentF64) { offload_is_bitwise_resident<double>(); }

TEST(AdamWOffload, Bf16WorkingWeightsAreBitwiseResident) {
  auto backend = Backend::create(BackendOptions{});
  constexpr int kSteps = 5;
  Trained resident =
      make_trained(*backend, DType::bf16, optimizer_config(OptimizerPlacement::resident));
  ASSERT_EQ(resident.params->flat_grads().dtype(), DType::f32) << "fp32 main gradients";
  const std::vector<char> initial = bytes_of(resident.params->flat_values());
  run_steps<float>(*backend, resident, kSteps);
  ASSERT_NE(bytes_of(resident.params->flat_values()), initial) << "the steps changed nothing";
  const std::vector<char> resident_master = bytes_of(state_of(*resident.optimizer, "master"));
  const int64_t P = resident.params->flat_values().numel();

  for (const OptimizerConfig& config :
       {optimizer_config(OptimizerPlacement::offload_serial),
        optimizer_config(OptimizerPlacement::offload_stream, 300, 3)}) {
    const std::string what = std::string(enum_name(config.placement)) + " bf16";
    Trained run = make_trained(*backend, DType::bf16, config);
    run_steps<float>(*backend, run, kSteps);
    expect_same_state(run, resident, what);
    EXPECT_EQ(bytes_of(state_of(*run.optimizer, "master")), resident_master) << what;
    const MemoryStats pinned = backend->pinned().stats();
    EXPECT_EQ(pinned.current()[LiveSet::optimizer],
              schedules::adamw_offload_host_bytes(P, DType::f32))
        << what;
    if (config.placement == OptimizerPlacement::offload_serial) {
      EXPECT_EQ(pinned.current()[LiveSet::grads],
                schedules::adamw_offload_serial_grad_bytes(P, DType::f32));
      EXPECT_EQ(pinned.current()[LiveSet::weights],
                schedules::adamw_offload_serial_weight_bytes(P, DType::bf16));
      EXPECT_EQ(schedules::adamw_offload_serial_weight_bytes(P, DType::bf16),
                PinnedPool::footprint(static_cast<uint64_t>(P) * 2));
      EXPECT_EQ(backend->arena().stats().current()[LiveSet::optimizer],
                schedules::adamw_resident_bytes(P, DType::bf16))
          << "the serial offload adds nothing to resident's device state";
    }
  }
  EXPECT_EQ(schedules::adamw_offload_serial_weight_bytes(P, DType::f32), 0u)
      << "f32 weights are copied up from the master itself";
}

TEST(AdamWOffload, SlowedStreamsStillGiveResidentsBits) {
  auto backend = Backend::create(BackendOptions{});
  Trained resident =
      make_trained(*backend, DType::f32, optimizer_config(OptimizerPlacement::resident));
  run_steps<float>(*backend, resident, 3);
  // Small buckets and two slots: every slot is reused many times per step.
  for (int slowed = 0; slowed < 3; ++slowed) {
    Trained run = make_trained(*backend, DType::f32,
                               optimizer_config(OptimizerPlacement::offload_stream, 300, 2));
    auto& o = dynamic_cast<schedules::OffloadStreamAdamW&>(*run.optimizer);
    ASSERT_GE(o.shape().buckets, 6);
    Stream* streams[3] = {&o.h2d_stream(), &o.update_stream(), &o.d2h_stream()};
    as_cpu_stream(*streams[slowed]).set_debug_delay(std::chrono::microseconds(300));
    run_steps<float>(*backend, run, 3);
    expect_same_state(run, resident,
                      "offload_stream with stream " + streams[slowed]->name() + " slowed");
  }
}

TEST(AdamWOffload, DevicePeakEqualsTheStagingBytesExactly) {
  auto backend = Backend::create(BackendOptions{});
  for (const auto& [bucket, slots] :
       std::vector<std::pair<int64_t, int64_t>>{{7, 2}, {300, 3}, {1000, 5}, {1 << 20, 3}}) {
    Trained run = make_trained(*backend, DType::f32,
                               optimizer_config(OptimizerPlacement::offload_stream, bucket, slots));
    auto& o = dynamic_cast<schedules::OffloadStreamAdamW&>(*run.optimizer);
    const int64_t P = run.params->flat_values().numel();
    const schedules::OffloadStreamShape shape = schedules::offload_stream_shape(P, bucket, slots);
    EXPECT_EQ(o.shape().bucket, shape.bucket);
    EXPECT_EQ(o.shape().slots, shape.slots);
    const uint64_t bound =
        schedules::adamw_offload_stream_bytes(shape.bucket, shape.slots, DType::f32);
    EXPECT_EQ(bound, shape.slots * DeviceArena::footprint(3 * shape.bucket * 4));
    backend->arena().reset_peaks();
    EXPECT_EQ(backend->arena().stats().current()[LiveSet::optimizer], 0u)
        << "no staging between steps";
    run_steps<float>(*backend, run, 1);
    const MemoryStats s = backend->arena().stats();
    EXPECT_EQ(s.peak_per_set()[LiveSet::optimizer], bound) << "beta " << bucket << " s " << slots;
    EXPECT_EQ(o.staging_bytes(), bound);
    EXPECT_EQ(s.current()[LiveSet::optimizer], 0u) << "the slots are released after the step";
    const MemoryStats pinned = backend->pinned().stats();
    EXPECT_EQ(pinned.current()[LiveSet::optimizer],
              schedules::adamw_offload_host_bytes(P, DType::f32));
  }
}

TEST(AdamWOffload, SerialKeepsNothingOnTheDeviceAndResidentItsFormula) {
  auto backend = Backend::create(BackendOptions{});
  {
    Trained run =
        make_trained(*backend, DType::f32, optimizer_config(OptimizerPlacement::offload_serial));
    const int64_t P = run.params->flat_values().numel();
    backend->arena().reset_peaks();
    run_steps<float>(*backend, run, 1);
    EXPECT_EQ(backend->arena().stats().peak_per_set()[LiveSet::optimizer], 0u);
    const MemoryStats pinned = backend->pinned().stats();
    EXPECT_EQ(pinned.current()[LiveSet::optimizer],
              schedules::adamw_offload_host_bytes(P, DType::f32));
    EXPECT_EQ(pinned.current()[LiveSet::grads],
              schedules::adamw_offload_serial_grad_bytes(P, DType::f32));
    EXPECT_EQ(dynamic_cast<schedules::SerialOffloadAdamW&>(*run.optimizer).host_threads(), 2);
  }
  Trained run = make_trained(*backend, DType::f32, optimizer_config(OptimizerPlacement::resident));
  const int64_t P = run.params->flat_values().numel();
  EXPECT_EQ(backend->arena().stats().current()[LiveSet::optimizer],
            schedules::adamw_resident_bytes(P, DType::f32));
}

TEST(AdamWOffload, TheStagingBoundIsWhatTheDeviceMustHold) {
  // Room for weights + grads + exactly the staging of (beta 512, s 3); a 1024 bucket does not fit.
  const ParamLayout layout(model_config());
  const uint64_t model_bytes = 2 * DeviceArena::footprint(layout.total_elements() * 4);
  BackendOptions options;
  options.device_memory = model_bytes + schedules::adamw_offload_stream_bytes(512, 3, DType::f32);
  auto backend = Backend::create(options);
  Trained fits = make_trained(*backend, DType::f32,
                              optimizer_config(OptimizerPlacement::offload_stream, 512, 3));
  run_steps<float>(*backend, fits, 2);
  fits = Trained{};
  Trained too_big = make_trained(*backend, DType::f32,
                                 optimizer_config(OptimizerPlacement::offload_stream, 1024, 3));
  try {
    run_steps<float>(*backend, too_big, 1);
    ADD_FAILURE() << "a staging larger than the device fitted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "OffloadStreamAdamW staging slot");
  }
}

TEST(AdamWOffload, StateListsTheMomentsWhereTheyLive) {
  auto backend = Backend::create(BackendOptions{});
  for (OptimizerPlacement p : {OptimizerPlacement::resident, OptimizerPlacement::offload_serial,
                               OptimizerPlacement::offload_stream}) {
    Trained run = make_trained(*backend, DType::f32, optimizer_config(p));
    EXPECT_EQ(run.optimizer->placement(), p);
    const auto state = run.optimizer->state();
    ASSERT_EQ(state.size(), 2u) << "f32 working weights carry the master: no master saved";
    EXPECT_EQ(state[0].name, "exp_avg");
    EXPECT_EQ(state[1].name, "exp_avg_sq");
    const Placement where = p == OptimizerPlacement::resident ? Placement::device : Placement::host;
    for (const auto& s : state) {
      EXPECT_EQ(s.flat.placement(), where) << enum_name(p);
      EXPECT_EQ(s.flat.numel(), run.params->flat_values().numel());
    }
  }
  // load_master_from_weights: the master follows new working weights.
  Trained run =
      make_trained(*backend, DType::f32, optimizer_config(OptimizerPlacement::offload_stream));
  run.params->initialize(77, 0.3, backend->default_stream());
  run.optimizer->load_master_from_weights(backend->default_stream());
  EXPECT_EQ(bytes_of(dynamic_cast<schedules::OffloadStreamAdamW&>(*run.optimizer).master()),
            bytes_of(run.params->flat_values()));
}

TEST(AdamWOffload, ShapeOfTheBuckets) {
  auto s = schedules::offload_stream_shape(10, 4, 3);
  EXPECT_EQ(s.bucket, 4);
  EXPECT_EQ(s.buckets, 3);
  EXPECT_EQ(s.slots, 3);
  s = schedules::offload_stream_shape(10, 4, 8);
  EXPECT_EQ(s.slots, 3) << "never more slots than buckets";
  s = schedules::offload_stream_shape(10, 100, 3);
  EXPECT_EQ(s.bucket, 10) << "never a bucket larger than the state";
  EXPECT_EQ(s.buckets, 1);
  EXPECT_EQ(s.slots, 1);
  EXPECT_EQ(schedules::adamw_offload_stream_bytes(4, 3, DType::f32),
            3 * DeviceArena::footprint(48));
  EXPECT_EQ(schedules::adamw_offload_stream_bytes(1 << 20, 3, DType::f32), 3ull * 12 * (1 << 20));
  try {
    schedules::offload_stream_shape(10, 0, 3);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "optimizer.bucket_params must be >= 1, got 0");
  }
  try {
    schedules::offload_stream_shape(10, 4, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "optimizer.staging_slots must be >= 1, got 0");
  }
}

TEST(AdamWOffload, ConfigKeysAreChecked) {
  auto error_of = [](const std::string& set) {
    try {
      load_config({}, {set});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(error_of("optimizer.bucket_params=0"),
                  "optimizer.bucket_params must be >= 1, got 0");
  EXPECT_CONTAINS(error_of("optimizer.staging_slots=1"),
                  "optimizer.staging_slots must be >= 2, got 1");
  EXPECT_CONTAINS(error_of("optimizer.bucket_elements=5"),
                  "unknown key 'optimizer.bucket_elements'");  // renamed
  EXPECT_CONTAINS(error_of("optimizer.placement=offload"),
                  "optimizer.placement must be one of resident, offload_serial, offload_stream");
  const Config cfg = load_config({}, {"optimizer.placement=offload_stream",
                                      "optimizer.bucket_params=4096", "optimizer.staging_slots=4"});
  EXPECT_EQ(cfg.optimizer.placement, OptimizerPlacement::offload_stream);
  EXPECT_EQ(cfg.optimizer.bucket_params, 4096);
  EXPECT_EQ(cfg.optimizer.staging_slots, 4);
}

}  // namespace
}  // namespace moepeak
