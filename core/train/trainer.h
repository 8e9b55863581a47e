// The training loop (`moepeak train`): backend, data, model, optimizer, learning-rate schedule,
// clipping, metrics, checkpoints — one rank with the standard schedule of each live set.
//
//   per step:  batch -> zero grads -> forward + backward (mean loss over scored tokens)
//              -> global grad norm -> clip factor -> AdamW(lr(step)) -> metrics -> checkpoint
//
// Peak memory is measured per step: the arena's peaks are reset when a step starts, so each
// metrics line shows that step's peak per live set beside the capacity.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/metrics/step_metrics.h"

namespace moepeak {

struct TrainOptions {
  bool resume = false;          // continue from the latest checkpoint of this run, if any
  std::string resume_from;      // or from this checkpoint directory
  std::string dump_step_dir;    // write the first step's weights, batch, loss and grads here
};

struct TrainResult {
  int64_t first_step = 0, last_step = 0;
  std::vector<double> losses;  // one per step run
  StepMetrics last;
  std::string run_dir, metrics_file;
};

// One training run's state: backend, model, optimizer, data, step counter. `train()` drives it
// to training.steps with metrics and checkpoints; `moepeak bench step` times step() directly.
class Trainer {
 public:
  // Sets everything up (and resumes, when the options say so). Creates nothing on disk.
  Trainer(const Config& config, const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs the next step (loads its batch, forward, backward, clip, AdamW) and returns its metrics.
  StepMetrics step();
  int64_t completed_steps() const;  // steps done so far, including those before a resume
  void save_checkpoint() const;     // into the run's checkpoint folder, after completed_steps()
  double flops_per_step() const;
  double gemm_ceiling_gflops() const;  // measured once at setup (flops.h)
  std::string describe() const;        // backend, model and data, for the log

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Runs training to training.steps: metrics each step, checkpoints as configured, the step-1
// dump when asked. Throws moepeak::Error on bad input or failure.
TrainResult train(const Config& config, const TrainOptions& options);

}  // namespace moepeak
