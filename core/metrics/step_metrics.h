// Per-step training metrics: a torchtitan-like console line, one JSON object per step appended
// to the metrics file (docs/design.md#machine-readable-outputs names), and a progress line with ETA
// when stdout is a terminal.
//
//   step:  10  loss:  2.4512  grad_norm:  0.8123  lr: 3.00e-03  memory:  0.05GiB(2.5%)
//   tps: 14,512  tflops: 0.021  mfu: 21.3%
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/data_loader.h"  // defines: SourceShare
#include "core/metrics/tensorboard_writer.h"
#include "core/runtime/memory_stats.h"

namespace moepeak {

// One evaluation (eval.*): the held-out loss after a step.
struct EvalMetrics {
  double loss = 0;        // mean cross-entropy over the eval tokens (nats)
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // scored eval tokens
  double seconds = 0;
  uint64_t peak_total = 0;      // device bytes at the evaluation's peak (this rank)
  MemorySnapshot peak_per_set;  // each live set's peak during it
};

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  // training.on_nonfinite = "skip": this step's loss or gradient norm was not finite and its
  // update was dropped; skipped_steps counts such steps in the run so far.
  bool skipped = false;
  int64_t skipped_steps = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;  // the job's: B*T over the slowest rank's step time
  int world_size = 1;
  double tflops = 0;            // achieved model TFLOP/s (flops.h)
  double mfu = 0;               // tflops / peak, in [0, 1]
  uint64_t peak_total = 0;      // device bytes at the step's peak
  MemorySnapshot peak_per_set;  // each live set's own peak during the step
  MemorySnapshot at_peak;       // live sets at the moment of the total peak
  PhaseBytes phase_peaks;       // the total's peak in each phase of the step
  std::array<MemorySnapshot, kNumStepPhases> phase_at_peak{};  // the sets at each phase's peak
  // Each live set's own peak in each phase of the step (MemoryStats::phase_peak_per_set).
  std::array<MemorySnapshot, kNumStepPhases> phase_peak_per_set{};
  uint64_t capacity = 0;             // device memory capacity
  uint64_t arena_high_water = 0;     // the arena's highest block end in the step (>= peak_total)
  MemorySnapshot host_peak_per_set;  // pinned host pool, each live set's peak so far in the run
  // CUDA only (0 on the CPU backend): the driver's view of this rank's device after the step.
  // device_used: total - free (the arena, the CUDA context, cuBLAS workspaces, NCCL buffers, and
  // any other process on the GPU); used_before_arena: the same when the device was opened.
  uint64_t device_used = 0;
  uint64_t used_before_arena = 0;
  // Per rank (W entries, rank order): this rank's tokens over its own step time, and its total
  // device peak. The console line shows the largest peak.
  std::vector<double> rank_tokens_per_s;
  std::vector<uint64_t> rank_peak_bytes;
  // A blend's datasets: the sequences each has given so far in the run (empty otherwise).
  std::vector<SourceShare> data_shares;
  std::optional<EvalMetrics> eval;  // when an evaluation followed this step
  uint64_t max_rank_peak() const;
};

nlohmann::json step_metrics_json(const StepMetrics& m);
std::string step_metrics_line(const StepMetrics& m);
// The step's scalars for TensorBoard (metrics.tensorboard), each the value of its JSON object's
// key beside it: train/loss (loss), train/grad_norm, train/lr, perf/tokens_per_s, perf/tflops,
// perf/mfu, memory/total_peak_bytes and memory/<live set>_peak_bytes (peak_bytes' entries), and
// after an evaluation eval/loss (eval_loss) and eval/perplexity (eval_perplexity).
std::vector<TensorBoardScalar> step_metrics_scalars(const StepMetrics& m);

class MetricsLog {
 public:
  // path: the JSONL file (created or appended to; its directory must exist). progress: draw a
  // progress line on stdout.
  MetricsLog(const std::string& path, bool progress, int64_t first_step, int64_t last_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends the JSON line (flushed, so a killed run keeps every finished step); prints the console
  // line when `print` and redraws the progress line.
  void record(const StepMetrics& m, bool print);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool progress_;
  int64_t first_step_, last_step_;
  double elapsed_s_ = 0;
};

}  // namespace moepeak
