// The collective watchdog: a timer on every communication operation of this process, so that a
// collective or send/recv whose peers never come (a rank killed where the launcher did not end
// the job, a rank hung, or one far behind) ends the job with a message naming the rank, the
// operation, its communicator and the step, instead of hanging until the scheduler's time limit.
//
//   start_collective_watchdog(cfg.runtime.collective_timeout);  // the trainer, once
//   { CollectiveWatch watch("all_reduce", comm.name(), comm.rank(), comm.world_size()); ... }
//
// One thread checks the operations in flight every min(1 s, timeout / 4); the first to pass the
// timeout aborts the job: the message goes to stderr, then the abort handler runs (default:
// MPI_Abort on MPI_COMM_WORLD with exit code kWatchdogExitCode when MPI is up, else _exit). A
// timeout of 0 turns the watchdog off. Not NCCL's: a NCCL operation returns before it runs; the
// GPU path's timeout is NCCL's own (docs/reliability.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace moepeak {

// The exit code of a job the watchdog ended (MPI_Abort's, which the launcher returns).
inline constexpr int kWatchdogExitCode = 3;

// Starts (or restarts with a new timeout) the watchdog; timeout_s = 0 stops it. `on_timeout`
// replaces the default abort (tests); it must not return control to the hung operation.
void start_collective_watchdog(double timeout_s,
                               std::function<void(const std::string& message)> on_timeout = {});
void stop_collective_watchdog();

// One operation in flight on the communicator `comm` (its name, this rank in it, its size), from
// construction to destruction. Cheap when the watchdog is off (one atomic load).
class CollectiveWatch {
 public:
  CollectiveWatch(std::string_view op, std::string_view comm, int comm_rank, int comm_size);
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

 private:
  uint64_t id_ = 0;  // 0: not registered (the watchdog was off)
};

}  // namespace moepeak
