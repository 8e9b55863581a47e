// AdamW measurement shared by `moepeak bench adamw` and `moepeak tune` (adamw_measure.h).
// Test: ctest -R bench_adamw, test_tune
#include "core/measure/adamw_measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "core/comm/comm.h"
#include "core/error.h"
#include "core/measure/harness.h"
#include "core/runtime/arena.h"
#include "core/runtime/pinned_pool.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/optimizer_choice.h"
#include "ops/schedules/schedule_dtype.h"

namespace moepeak::measure {
namespace {

int64_t align_up(int64_t n) { return (n + kAdamwAlign - 1) / kAdamwAlign * kAdamwAlign; }

// The optimizer's flat state `name`, or an empty view when it keeps none of that name (no
// "master" beside f32 working weights).
Tensor state_named(const schedules::Optimizer& o, const char* name) {
  for (const auto& s : o.state()) {
    if (s.name == name) return s.flat;
  }
  return Tensor();
}

// The tensor's values as floats on the host, wherever it lives (device weights, pinned host
// state): f32 as is, bf16 widened (exactly).
std::vector<float> floats_of(const Tensor& t, Backend& backend, Stream& stream) {
  const std::vector<char> bytes = copy_to_host(t, backend, stream);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::bf16) {
    const auto* bits = reinterpret_cast<const uint16_t*>(bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16::to_float(bits[i]);
  } else {
    MOEPEAK_CHECK(t.dtype() == DType::f32, "adamw bench: state of dtype ", dtype_name(t.dtype()));
    std::memcpy(out.data(), bytes.data(), bytes.size());
  }
  return out;
}

}  // namespace

AdamwParams make_adamw_params(Backend& backend, int64_t count, DType working, Stream& stream) {
  MOEPEAK_CHECK(working == DType::f32 || working == DType::bf16,
                "adamw bench: working weights must be f32 or bf16, not ", dtype_name(working));
  AdamwParams p;
  const DType grad_dtype = schedules::main_grad_dtype(working);
  const int64_t piece = std::max<int64_t>(1, (count + kAdamwPieces - 1) / kAdamwPieces);
  std::vector<std::pair<int64_t, int64_t>> spans;  // offset, length
  for (int64_t done = 0; done < count; done += piece) {
    spans.push_back({p.elements, std::min(piece, count - done)});
    p.elements += align_up(spans.back().second);
  }
  p.values =
      OwnedTensor::device(backend, Shape{p.elements}, working, LiveSet::weights, "bench weights");
  p.grads =
      OwnedTensor::device(backend, Shape{p.elements}, grad_dtype, LiveSet::grads, "bench grads");
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(p.elements), 0.0f);
  std::vector<float> g(static_cast<size_t>(p.elements), 0.0f);
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto [off, len] = spans[i];
    for (int64_t j = 0; j < len; ++j) {
      w[static_cast<size_t>(off + j)] = 0.02f * normal(rng);
      g[static_cast<size_t>(off + j)] = 1e-3f * normal(rng) + 1e-5f;
    }
    auto view = [&, off = off, len = len](const OwnedTensor& t) {
      return Tensor(
          static_cast<char*>(t.data()) + off * static_cast<int64_t>(dtype_size(t.view().dtype())),
          Shape{len}, t.view().dtype(), Placement::device, &backend);
    };
    p.pieces.push_back({view(p.values), view(p.grads), i % 4 != 3});
  }
  p.initial.resize(p.values.nbytes());
  if (working == DType::bf16) {
    auto* bits = reinterpret_cast<uint16_t*>(p.initial.data());
    for (size_t i = 0; i < w.size(); ++i) bits[i] = bf16::from_float(w[i]);
  } else {
    std::memcpy(p.initial.data(), w.data(), p.initial.size());
  }
  backend.copy_async(p.grads.data(), g.data(), g.size() * 4, CopyKind::host_to_device, stream);
  stream.synchronize();
  return p;
}

void reset_adamw_params(Backend& backend, AdamwParams& p, Stream& stream) {
  backend.copy_async(p.values.data(), p.initial.data(), p.initial.size(), CopyKind::host_to_device,
                     stream);
  stream.synchronize();
}

uint64_t adamw_bandwidth_bytes(int64_t count) {
  const uint64_t P = static_cast<uint64_t>(align_up(count) + kAdamwPieces * kAdamwAlign);
  return std::min<uint64_t>(256ull << 20, std::max<uint64_t>(12 * P, 1 << 20));
}

BackendOptions adamw_backend_options(const Config& cfg, const RankInfo& ranks, int64_t count,
                                     int64_t max_bucket, int64_t max_slots, int threads,
                                     DType working) {
  // Sized to what the runs need (a model of its own), not runtime.device_memory: one optimizer
  // lives at a time, but each placement's bytes are added up so that no order of frees and
  // allocations can leave the next one short.
  const int64_t P = align_up(count) + kAdamwPieces * kAdamwAlign;
  const uint64_t Pu = static_cast<uint64_t>(P);
  const DType state = schedules::adamw_state_dtype(working);
  const uint64_t bw_bytes = adamw_bandwidth_bytes(count);
  BackendOptions bo = bench_any_backend_options(cfg, ranks);
  bo.device_memory = DeviceArena::footprint(Pu * dtype_size(working)) +
                     DeviceArena::footprint(Pu * dtype_size(schedules::main_grad_dtype(working))) +
                     schedules::adamw_resident_bytes(P, working) +
                     schedules::adamw_offload_stream_bytes(max_bucket, max_slots, state) +
                     DeviceArena::footprint(bw_bytes) + (64ull << 20);
  bo.pinned_budget = schedules::adamw_offload_host_bytes(P, state) +
                     schedules::adamw_offload_serial_grad_bytes(P, state) +
                     schedules::adamw_offload_serial_weight_bytes(P, working) +
                     PinnedPool::footprint(bw_bytes) + (64ull << 20);
  bo.numa_node = static_cast<int>(cfg.runtime.numa_node);
  bo.cpu_threads = threads > 0 ? threads : static_cast<int>(cfg.runtime.threads);
  // NOTES: on CUDA the serial offload's host AdamW threads come from cpu_threads too
  // (adamw_host_threads); the backend itself does not use them.
  return bo;
}

int adamw_host_threads(const BackendOptions& options, const RankInfo& ranks) {
  return options.cpu_threads > 0
             ? options.cpu_threads
             : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                               std::max(1, ranks.local_size));
}

LinkBandwidth pinned_bandwidth(Backend& backend, uint64_t bytes, Stream& stream) {
  OwnedTensor host = OwnedTensor::pinned(backend, Shape{static_cast<int64_t>(bytes / 4)},
                                         DType::f32, LiveSet::workspace, "bench pinned bandwidth");
  OwnedTensor dev = OwnedTensor::device(backend, Shape{static_cast<int64_t>(bytes / 4)}, DType::f32,
                                        LiveSet::workspace, "bench device bandwidth");
  std::memset(host.data(), 1, host.nbytes());
  char* h = static_cast<char*>(host.data());
  char* d = static_cast<char*>(dev.data());
  const size_t all = host.nbytes(), half = all / 2;
  std::unique_ptr<Stream> down = backend.create_stream("bench copy down");
  // Best of 6 timings of `issue` (the first run touches the pages; it counts like the others).
  auto best = [&](auto issue) {
    double t_best = 1e30;
    for (int i = 0; i < 6; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      issue();
      stream.synchronize();
      down->synchronize();
      t_best = std::min(
          t_best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return t_best;
  };
  LinkBandwidth bw;
  bw.h2d = static_cast<double>(all) /
           best([&] { backend.copy_async(d, h, all, CopyKind::host_to_device, stream); });
  bw.d2h = static_cast<double>(all) /
           best([&] { backend.copy_async(h, d, all, CopyKind::device_to_host, stream); });
  // NOTES: the two halves are disjoint in both memories, so the copies may overlap freely; the
  // time is until both are done, so the rate is the slower direction's.
  bw.both_ways =
      static_cast<double>(half) / best([&] {
        backend.copy_async(d, h, half, CopyKind::host_to_device, stream);
        backend.copy_async(h + half, d + half, all - half, CopyKind::device_to_host, *down);
      });
  return bw;
}

std::unique_ptr<schedules::Optimizer> make_adamw(Backend& backend, AdamwParams& p,
                                                 const OptimizerConfig& o, int host_threads) {
  return schedules::make_optimizer(backend, {p.values.view(), p.pieces}, o, host_threads);
}

AdamwRun time_adamw(Backend& backend, AdamwParams& p, schedules::Optimizer& optimizer, int warmup,
                    int iters, Stream& stream) {
  AdamwRun run;
  backend.arena().reset_peaks();
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    optimizer.step(i + 1, 1e-3, i % 2 ? 0.5 : 1.0, stream);
    stream.synchronize();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) run.times.push_back(t);
  }
  run.peaks = backend.arena().stats();
  run.weights = floats_of(p.values.view(), backend, stream);
  run.m = floats_of(state_named(optimizer, "exp_avg"), backend, stream);
  run.v = floats_of(state_named(optimizer, "exp_avg_sq"), backend, stream);
  const Tensor master = state_named(optimizer, "master");
  if (master.data() != nullptr) run.master = floats_of(master, backend, stream);
  return run;
}

double float_max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) == 0) continue;
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, d / std::max(std::abs(static_cast<double>(b[i])), 1e-30));
  }
  return worst;
}

}  // namespace moepeak::measure
