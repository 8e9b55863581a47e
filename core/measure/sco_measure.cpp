// SCO measurement shared by `moepeak bench sco` and `moepeak tune` (sco_measure.h).
// Test: ctest -R bench_sco, test_tune
#include "core/measure/sco_measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "core/error.h"
#include "core/measure/harness.h"
#include "core/units.h"
#include "ops/schedules/checkpoint_sco.h"

namespace moepeak::measure {
namespace {

using Clock = std::chrono::steady_clock;
constexpr DType kDtype = DType::f32;

// Seconds to copy one (N, H) boundary device -> host and back on a stream of its own: the median
// of 7 after one untimed.
double boundary_round_trip_s(Backend& backend, int64_t tokens, int64_t hidden) {
  OwnedTensor device =
      OwnedTensor::device(backend, Shape{tokens, hidden}, kDtype, LiveSet::workspace, "bench copy");
  OwnedTensor host =
      OwnedTensor::pinned(backend, Shape{tokens, hidden}, kDtype, LiveSet::workspace, "bench copy");
  std::unique_ptr<Stream> stream = backend.create_stream("bench copy");
  backend.memset_async(device.data(), 1, device.nbytes(), *stream);
  std::vector<double> times;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = Clock::now();
    backend.copy_async(host.data(), device.data(), device.nbytes(), CopyKind::device_to_host,
                       *stream);
    backend.copy_async(device.data(), host.data(), device.nbytes(), CopyKind::host_to_device,
                       *stream);
    stream->synchronize();
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(times);
}

uint64_t sco_host_bytes_one(int64_t tokens, int64_t hidden) {
  return schedules::sco_host_bytes(1, tokens, hidden, kDtype);
}

}  // namespace

BackendOptions sco_backend_options(const Config& cfg, const RankInfo& ranks, int64_t batch,
                                   int64_t seq_len) {
  const int64_t N = batch * seq_len, H = cfg.model.hidden_size, L = cfg.model.num_hidden_layers;
  const uint64_t half_budget = schedules::sco_host_bytes(L / 2, N, H, kDtype);
  const uint64_t all_budget = schedules::sco_host_bytes(L, N, H, kDtype);
  BackendOptions options = bench_any_backend_options(cfg, ranks);
  // NOTES: the pool caches freed blocks by size, so it must hold the "all" and "half" rows' blocks
  // at once, plus the copy-timing buffer.
  options.pinned_budget = std::max(cfg.runtime.pinned_memory_bytes().value_or(GiB),
                                   all_budget + half_budget + sco_host_bytes_one(N, H));
  return options;
}

ScoSweep measure_sco_sweep(Backend& backend_ref, const Config& cfg, int64_t B, int64_t T,
                           int warmup, int iters,
                           const std::function<void(const std::string&)>& on_step) {
  Backend* backend = &backend_ref;
  const ModelConfig& m = cfg.model;
  const int64_t N = B * T, H = m.hidden_size, L = m.num_hidden_layers;
  DecoderModel::check_layout(m, B, T, 1);
  Stream& stream = backend->default_stream();
  ScoSweep sweep;
  sweep.comm = make_comm(*backend, RankInfo{});
  std::unique_ptr<Comm>& comm = sweep.comm;
  std::vector<ScoRow>& rows = sweep.rows;
  const uint64_t half_budget = schedules::sco_host_bytes(L / 2, N, H, kDtype);
  const uint64_t all_budget = schedules::sco_host_bytes(L, N, H, kDtype);
  // One batch of random tokens, the same for every row.
  OwnedTensor ids = OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "ids");
  OwnedTensor labels =
      OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
  OwnedTensor positions =
      OwnedTensor::device(*backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.job.seed));
  std::uniform_int_distribution<int64_t> token(0, m.vocab_size - 1);
  std::vector<int64_t> host_ids(static_cast<size_t>(N)), host_labels(host_ids.size()),
      host_positions(host_ids.size());
  for (int64_t& id : host_ids) id = token(rng);
  for (size_t n = 0; n < host_ids.size(); ++n) {
    host_labels[n] = static_cast<int64_t>(n) % T == T - 1 ? -100 : host_ids[n + 1];
    host_positions[n] = static_cast<int64_t>(n) % T;
  }
  for (auto [to, from] : {std::pair{&ids, &host_ids}, std::pair{&labels, &host_labels},
                          std::pair{&positions, &host_positions}}) {
    backend->copy_async(to->data(), from->data(), from->size() * sizeof(int64_t),
                        CopyKind::host_to_device, stream);
  }
  stream.synchronize();
  const int64_t scored = N - B;
  const TokenBatch batch{ids, labels, positions, B, T, scored};

  rows.emplace_back("standard", CheckpointSchedule::standard, std::nullopt);
  rows.emplace_back("sco none", CheckpointSchedule::sco, uint64_t{0});
  rows.emplace_back("sco half", CheckpointSchedule::sco, half_budget);
  rows.emplace_back("sco all", CheckpointSchedule::sco, all_budget);
  for (ScoRow& r : rows) {
    SchedulesConfig s = cfg.schedules;
    s.checkpoint = r.checkpoint;
    if (r.host_budget) s.sco_host_budget = std::to_string(*r.host_budget);
    const MemorySnapshot before = backend->arena().stats().current();
    r.model = std::make_unique<DecoderModel>(*backend, stream, *comm, m, s, kDtype);
    if (&r == &rows.front()) {
      r.model->params().initialize(static_cast<uint64_t>(cfg.job.seed), m.initializer_range,
                                   stream);
    } else {  // the same weights, copied (initialising is slow for a 50M-parameter model)
      const Tensor from = rows.front().model->params().flat_values();
      backend->copy_async(r.model->params().flat_values().data(), from.data(), from.nbytes(),
                          CopyKind::device_to_device, stream);
    }
    stream.synchronize();
    const MemorySnapshot after = backend->arena().stats().current();
    for (size_t set = 0; set < kNumLiveSets; ++set)
      r.resident.bytes[set] = after.bytes[set] - before.bytes[set];
  }
  MemorySnapshot& all_resident = sweep.all_resident;
  for (const ScoRow& r : rows) {
    for (size_t set = 0; set < kNumLiveSets; ++set)
      all_resident.bytes[set] += r.resident.bytes[set];
  }
  sweep.round_trip_s = boundary_round_trip_s(*backend, N, H);
  sweep.boundary_bytes = DeviceArena::footprint(static_cast<uint64_t>(N * H) * dtype_size(kDtype));

  for (int i = 0; i < warmup + iters; ++i) {
    for (size_t k = 0; k < rows.size(); ++k) {
      ScoRow& r = rows[(k + static_cast<size_t>(i)) % rows.size()];  // each row goes first in turn
      r.model->params().zero_grads(stream);
      stream.synchronize();
      backend->arena().reset_peaks();
      backend->pinned().reset_peaks();
      const auto t0 = Clock::now();
      r.loss = r.model->forward_backward(batch, scored);
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= warmup) r.times.push_back(t);
      r.device = backend->arena().stats();
      r.host = backend->pinned().stats();
      auto* sco = dynamic_cast<schedules::ScoBoundaries*>(&r.model->boundaries());
      r.offloaded = sco != nullptr ? sco->offloaded_layers() : 0;
      if (on_step) on_step(r.label);
    }
  }

  return sweep;
}

double sco_max_rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  MOEPEAK_CHECK(a.size() == b.size(), "sco_max_rel_err: ", a.size(), " vs ", b.size(), " elements");
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double d = std::abs(a[i] - b[i]);
    const double scale = std::max({std::abs(a[i]), std::abs(b[i]), 1e-30});
    worst = std::max(worst, std::isnan(d) ? std::numeric_limits<double>::infinity() : d / scale);
  }
  return worst;
}

}  // namespace moepeak::measure
