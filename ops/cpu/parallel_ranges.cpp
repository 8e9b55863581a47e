// parallel_ranges: see parallel_ranges.h.
#include "ops/cpu/parallel_ranges.h"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "ops/cpu/worker_pool.h"

namespace moepeak::ops {

int cpu_op_threads() { return std::max(1, openblas_get_num_threads()); }

void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  parallel_ranges(n, grain, cpu_op_threads(), body);
}

SingleThreadedBlas::SingleThreadedBlas() : before_(openblas_get_num_threads()) {
  if (before_ != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (before_ != 1) openblas_set_num_threads(before_);
}

void parallel_ranges(int64_t n, int64_t grain, int threads,
                     const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  threads = std::max(1, threads);
  if (threads == 1 || n < 2 * grain) {
    body(0, n);
    return;
  }
  thread_local std::unique_ptr<WorkerPool> pool;
  if (!pool || pool->threads() != threads) pool = std::make_unique<WorkerPool>(threads);
  // A few ranges per thread, so a thread that is descheduled for a while does not hold the rest.
  const int64_t grains = (n + grain - 1) / grain;
  const int64_t tasks = std::min<int64_t>(grains, 4 * static_cast<int64_t>(threads));
  const int64_t per_task = (grains + tasks - 1) / tasks * grain;
  const int64_t count = (n + per_task - 1) / per_task;
  pool->run(count, [&](int64_t t) {
    const int64_t begin = t * per_task;
    body(begin, std::min(n, begin + per_task));
  });
}

}  // namespace moepeak::ops
