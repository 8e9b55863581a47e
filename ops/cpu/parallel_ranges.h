// parallel_ranges: the CPU ops' loops over independent rows or elements, split over this rank's
// compute threads (the share of the cores the CPU backend gave OpenBLAS: runtime.threads) instead
// of the one stream worker thread an op's task runs on.
//
//   parallel_ranges(tokens, rows_per_task, [&](int64_t begin, int64_t end) {
//     for (int64_t n = begin; n < end; ++n) one_row(n);
//   });
//
// [0, n) is cut into contiguous ranges (each a multiple of `grain` except the last, so a loop
// that vectorises from its range's start covers the same elements in vectors as a serial loop
// when grain is a multiple of the vector width); every index is handled by exactly one thread with
// the serial loop's arithmetic, so the results are bitwise those of one thread. Below two grains,
// or with one thread, the body runs once on the caller. Blocks until every range is done; the
// first exception a range throws is rethrown.
//
// NOTES: the threads are a WorkerPool owned by the calling thread (thread_local), made on first
// use: each stream's worker thread has its own, so two streams' ops never share a pool (a pool
// runs one loop at a time). A body must not call parallel_ranges itself.
// Test: tests/ops/test_parallel_ranges.cpp
#pragma once

#include <cstdint>
#include <functional>

namespace moepeak::ops {

// The threads parallel_ranges uses on this thread: OpenBLAS's thread count (>= 1).
int cpu_op_threads();

void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// The same over `threads` threads (>= 1) rather than cpu_op_threads().
void parallel_ranges(int64_t n, int64_t grain, int threads,
                     const std::function<void(int64_t, int64_t)>& body);

// Holds OpenBLAS to one thread for its scope (restoring the count after), for loops whose
// ranges each call GEMMs: the ranges are the parallelism. OpenBLAS's GEMMs split rows and
// columns among its threads, never the inner dimension, so a GEMM's result does not depend on
// how many it uses.
// NOTES: OpenBLAS's thread count is process-wide: a GEMM another stream starts meanwhile also runs
// on one thread — slower, never different.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int before_;
};

}  // namespace moepeak::ops
