#include "core/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace moepeak {

double learning_rate(const OptimizerConfig& opt, const LrSchedulerConfig& sched,
                     int64_t total_steps, int64_t step) {
  const double lr = opt.lr;
  const double min_lr = lr * sched.min_lr_ratio;
  if (sched.warmup_steps > 0 && step <= sched.warmup_steps) {
    return lr * static_cast<double>(step) / static_cast<double>(sched.warmup_steps);
  }
  if (sched.decay == LrDecay::constant || total_steps <= sched.warmup_steps) return lr;
  double p = static_cast<double>(step - sched.warmup_steps) /
             static_cast<double>(total_steps - sched.warmup_steps);
  p = std::clamp(p, 0.0, 1.0);
  if (sched.decay == LrDecay::linear) return lr - (lr - min_lr) * p;
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace moepeak
