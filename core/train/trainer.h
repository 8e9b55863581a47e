// The training loop (`moepeak train`): backend, data, model, optimizer, learning-rate schedule,
// clipping, metrics, checkpoints — on the W ranks the launcher started (mpirun, srun; W = 1 for a
// plain process) in the layout of docs/design.md#parallel-layout, with the standard schedule of
// each live set and the AdamW that optimizer.placement names (ops/schedules/optimizer.h: resident,
// offload_serial, offload_stream — bitwise the same updates).
//
//   per step:  this rank's block of the global batch (its slice of its sequences, read alone)
//              -> zero grads -> forward + backward (the job's mean loss over scored tokens)
//              -> grad norm over all ranks' shards -> clip factor -> AdamW on this rank's shard
//              -> metrics (job and per rank) -> evaluation (eval.interval) -> checkpoint
//
// Every rank computes the same loss, grad norm and learning rate; rank 0 writes the metrics file
// and the checkpoints. Peak memory is measured per step: the arena's peaks are reset when a step
// starts, so each metrics line shows that step's peak per live set beside the capacity (rank
// 0's live sets, every rank's total).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/metrics/step_metrics.h"
#include "core/runtime/dtype.h"

namespace moepeak {

// runtime.backend resolved: "cuda", or "auto" on a build with CUDA and a usable GPU. What the
// trainer and the benches that run on either backend (gemm, vocab) create.
bool uses_cuda_backend(const Config& cfg);
// training.dtype resolved as `moepeak plan` reads it: "auto" is bf16 on CUDA and f32 on the CPU.
// bf16 (either backend) trains bf16 weights, gradients and activations with an fp32 AdamW master.
DType training_dtype(const Config& cfg);

// runtime.cpu_link_gb_per_s / cpu_link_latency_us as the CPU comm's link model (off at 0).
LinkModel link_model(const RuntimeConfig& runtime);

struct TrainOptions {
  bool resume = false;        // continue from the latest checkpoint of this run, if any
  std::string resume_from;    // or from this checkpoint directory
  std::string dump_step_dir;  // write the first step's weights, batch, loss and grads here
  // Preemption (docs/slurm.md): a signal number the caller's handler stores (SIGUSR1 from
  // `--signal=B:USR1@120` forwarded by slurm/train.sbatch, SIGTERM from scancel or preemption);
  // 0 = none. After every step the ranks agree on it with one collective (any rank's signal stops
  // all), checkpoint at that step boundary and return with TrainResult::stopped_by_signal set.
  // Null: no preemption check (and no collective).
  const std::atomic<int>* stop_signal = nullptr;
};

struct TrainResult {
  int64_t first_step = 0, last_step = 0;
  std::vector<double> losses;  // one per step run
  StepMetrics last;
  struct Evaluation {
    int64_t step = 0;  // after which step
    EvalMetrics metrics;
  };
  std::vector<Evaluation> evals;  // every evaluation, in order
  std::string run_dir, metrics_file;
  std::string tensorboard_dir;  // <run_dir>/tensorboard with metrics.tensorboard, else empty
  // Non-zero: training stopped early at last_step on this signal, with a checkpoint of that step
  // written (the `moepeak train` exit code is then kExitRequeue; a --resume continues it).
  int stopped_by_signal = 0;
};

// One training run's state: backend, model, optimizer, data, step counter. `train()` drives it
// to training.steps with metrics and checkpoints; `moepeak bench step` times step() directly.
class Trainer {
 public:
  // Sets everything up (and resumes, when the options say so). Creates nothing on disk.
  // Collective over the launcher's ranks; a config the layout cannot train on W ranks (experts
  // or query heads not divisible by W, T % W != 0, ...) is an Error on every rank before any work.
  Trainer(const Config& config, const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs the next step (loads its batch, forward, backward, clip, AdamW) and returns its metrics.
  StepMetrics step();
  // The held-out loss (eval.*): eval.batches batches of eval.dataset_path, the same windows every
  // time (file order from its start), each rank reading its block, through the training
  // schedules forward only (DecoderModel::forward_cross_entropy: no boundaries kept, no
  // gradients, no optimizer). Changes nothing that training reads: the training data cursor,
  // weights, gradients and optimizer state are untouched, so a run's losses are bitwise the same
  // with and without evaluation. Its memory is a training forward's of the same B x T, inside
  // the step's plan (docs/design.md#conventions). Collective; moepeak::Error unless eval is set.
  EvalMetrics evaluate();
  int64_t completed_steps() const;  // steps done so far, including those before a resume
  // Into the run's checkpoint folder (collective). With checkpoint.async the step boundary only
  // snapshots the state (core/checkpoint/async_checkpoint.h) and waits for a save in flight.
  void save_checkpoint() const;
  // Collective after every step: commits an asynchronous save whose writes are done (no-op, and
  // no collective, when none is in flight).
  void poll_checkpoint() const;
  // Collective: waits for an asynchronous save in flight and commits it (end of training, stop).
  void finish_checkpoint() const;
  int rank() const;
  int world_size() const;
  // The sum of `value` over the ranks (collective; `value` itself on one rank).
  double sum_over_ranks(double value) const;
  // The largest of `value` over the ranks (collective).
  double max_over_ranks(double value) const;
  double flops_per_step() const;
  double gemm_ceiling_gflops() const;  // measured once at setup (flops.h)
  // GFLOP/s of an f32 n^3 GEMM on this rank's backend now, the best of `repeats` (OpenBLAS
  // directly on the CPU, the backend's linear_forward on CUDA; flops.h).
  double measure_gemm_ceiling(int n, int repeats) const;
  std::string describe() const;  // backend, model and data, for the log

 private:
  void log_committed(int64_t before) const;
  struct State;
  std::unique_ptr<State> s_;
};

// Runs training to training.steps: metrics each step, checkpoints as configured, the step-1
// dump when asked. Throws moepeak::Error on bad input or failure.
TrainResult train(const Config& config, const TrainOptions& options);

}  // namespace moepeak
