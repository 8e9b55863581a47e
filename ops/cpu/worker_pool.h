// WorkerPool: a fixed set of host threads that run the tasks of one parallel loop together with
// the calling thread — the threading of the multi-threaded host AdamW (ops/cpu/cpu_adamw.h),
// in place of OpenMP (not a dependency of moepeak).
//
//   WorkerPool pool(4);                   // the caller + 3 worker threads
//   pool.run(tasks, [&](int64_t t) {...}); // every t in [0, tasks) exactly once; blocks until done
//
// Tasks are handed out one at a time from an atomic counter, so threads that finish early take
// more (tiles of a loop need not cost the same). The first exception a task throws is rethrown
// by run() after every task has finished or been skipped.
//
// NOTES: one run() at a time per pool (run() is not re-entrant and a pool belongs to one
// optimizer); the threads sleep on a condition variable between runs.
// Test: tests/ops/test_adamw_kernels.cpp (WorkerPool.*).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moepeak::ops {

class WorkerPool {
 public:
  // threads <= 0: std::thread::hardware_concurrency(). threads = 1 runs everything on the caller.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void run(int64_t tasks, const std::function<void(int64_t)>& task);

 private:
  void work_loop();
  void drain();  // takes tasks of the current run until none is left

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t generation_ = 0;  // bumped by each run(); workers wake for a new value
  bool stop_ = false;
  int active_ = 0;  // workers still inside the current run
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

}  // namespace moepeak::ops
