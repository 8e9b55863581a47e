// Measuring standard checkpointing beside SCO over host budgets (none, half, all layers) on one
// rank, shared by `moepeak bench sco` (cli/bench_sco.cpp) and `moepeak tune`'s SCO sweep
// (core/measure/sweeps.cpp). One model per row, all resident at once, the same weights; the rows
// take turns in every repetition (each repetition starting with the next row), so a machine whose
// speed drifts slows them alike. Each step is the model's forward + backward (no optimizer).
//
//   auto backend = Backend::create(sco_backend_options(cfg, ranks, B, T));
//   ScoSweep s = measure_sco_sweep(*backend, cfg, B, T, warmup, iters, on_step);
//   s.rows[0]  standard; s.rows[1..3]  sco none / half / all; s.round_trip_s; s.boundary_bytes
//
// The model runs on a single-rank comm (SCO needs no communication): B x T are this rank's
// tokens. Test: ctest -R bench_sco, test_tune.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/decoder.h"
#include "core/runtime/backend.h"
#include "core/runtime/memory_stats.h"

namespace moepeak::measure {

// One row of the sweep: its model and what it measured.
struct ScoRow {
  ScoRow(std::string label, CheckpointSchedule checkpoint, std::optional<uint64_t> host_budget)
      : label(std::move(label)), checkpoint(checkpoint), host_budget(host_budget) {}

  std::string label;  // "standard", "sco none", "sco half", "sco all"
  CheckpointSchedule checkpoint;
  std::optional<uint64_t> host_budget;  // SCO's schedules.sco_host_budget (bytes)
  std::unique_ptr<DecoderModel> model;
  MemorySnapshot resident;  // the model's own weights and grads in the arena, per set
  std::vector<double> times;
  double loss = 0;
  MemoryStats device, host;
  int64_t offloaded = 0;
};

struct ScoSweep {
  std::unique_ptr<Comm> comm;   // the models' (single rank); outlives the rows
  std::vector<ScoRow> rows;     // standard, sco none, sco half, sco all
  MemorySnapshot all_resident;  // every row's weights and grads together
  double round_trip_s = 0;      // one (N, H) boundary device -> host -> device, alone
  uint64_t boundary_bytes = 0;  // its arena footprint
};

// The backend of a sweep of B x T tokens (runtime.backend: the rank's GPU on CUDA, as
// bench_any_backend_options): runtime.device_memory, and a pinned pool that holds the "all" and
// "half" rows' blocks at once plus the copy-timing buffer.
BackendOptions sco_backend_options(const Config& cfg, const RankInfo& ranks, int64_t batch,
                                   int64_t seq_len);

// `on_step(label)` is called after each row's step (progress).
ScoSweep measure_sco_sweep(Backend& backend, const Config& cfg, int64_t batch, int64_t seq_len,
                           int warmup, int iters,
                           const std::function<void(const std::string&)>& on_step = {});

// max |a - b| / max(|a|, |b|) over the elements (0 when equal; a and b as copy_to_host_as_double
// reads f32 gradients, exactly).
double sco_max_rel_err(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace moepeak::measure
