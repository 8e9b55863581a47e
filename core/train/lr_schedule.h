// Learning rate per step: linear warmup, then cosine / linear decay to lr * min_lr_ratio, or
// constant. Steps are 1-based, as the optimizer counts them.
//
//   step <= warmup:  lr * step / warmup
//   after warmup:    p = (step - warmup) / (steps - warmup) in (0, 1]
//                    cosine: min + (lr - min) * (1 + cos(pi p)) / 2;  linear: lr - (lr - min) p
#pragma once

#include <cstdint>

#include "core/config/config.h"

namespace moepeak {

double learning_rate(const OptimizerConfig& opt, const LrSchedulerConfig& sched,
                     int64_t total_steps, int64_t step);

}  // namespace moepeak
