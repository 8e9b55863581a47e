// The collective watchdog (core/comm/watchdog.h): a registry of operations in flight and one
// thread that checks their ages.
#include "core/comm/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/run_context.h"

namespace moepeak {
namespace {

using Clock = std::chrono::steady_clock;

struct InFlight {
  std::string op;
  std::string comm;  // the communicator's name
  int comm_rank = 0, comm_size = 1;
  int64_t step = 0;
  Clock::time_point start;
};

// 3, 0.2, 12.5: at most one decimal, none when it is 0.
std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  std::string out = buf;
  if (out.size() > 2 && out.compare(out.size() - 2, 2, ".0") == 0) out.resize(out.size() - 2);
  return out;
}

void default_abort(const std::string& /*message*/) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode);
  _exit(kWatchdogExitCode);
}

class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  ~Watchdog() { stop(); }

  void start(double timeout_s, std::function<void(const std::string&)> on_timeout) {
    stop();
    if (timeout_s <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ = std::chrono::duration<double>(timeout_s);
    on_timeout_ = on_timeout ? std::move(on_timeout) : default_abort;
    running_ = true;
    enabled_.store(true);
    thread_ = std::thread([this] { watch(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      enabled_.store(false);
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  uint64_t add(std::string_view op, std::string_view comm, int comm_rank, int comm_size) {
    if (!enabled_.load(std::memory_order_relaxed)) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = ++next_id_;
    in_flight_[id] = {std::string(op), std::string(comm),   comm_rank,
                      comm_size,       run_context::step(), Clock::now()};
    return id;
  }

  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(id);
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto period = std::min<Clock::duration>(
        std::chrono::seconds(1), std::chrono::duration_cast<Clock::duration>(timeout_ / 4));
    while (running_) {
      wake_.wait_for(lock, period, [this] { return !running_; });
      if (!running_) return;
      const Clock::time_point now = Clock::now();
      for (const auto& [id, f] : in_flight_) {  // ids grow with time: the oldest first
        const double waited = std::chrono::duration<double>(now - f.start).count();
        if (waited < timeout_.count()) continue;
        std::ostringstream m;
        m << "moepeak: collective watchdog: rank " << run_context::rank() << ": " << f.op
          << " on communicator '" << f.comm << "' (rank " << f.comm_rank << " of " << f.comm_size
          << ") has not completed after " << format_seconds(waited) << " s (runtime."
          << "collective_timeout = " << format_seconds(timeout_.count()) << " s), "
          << (f.step > 0 ? "at step " + std::to_string(f.step) : std::string("during setup"))
          << ": a peer is dead, hung or that far behind; aborting the job";
        const std::string message = m.str();
        std::fprintf(stderr, "%s\n", message.c_str());
        std::fflush(stderr);
        auto handler = on_timeout_;
        running_ = false;
        enabled_.store(false);
        lock.unlock();
        handler(message);
        return;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::thread thread_;
  bool running_ = false;
  std::atomic<bool> enabled_{false};
  std::chrono::duration<double> timeout_{0};
  std::function<void(const std::string&)> on_timeout_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, InFlight> in_flight_;
};

}  // namespace

void start_collective_watchdog(double timeout_s,
                               std::function<void(const std::string& message)> on_timeout) {
  Watchdog::get().start(timeout_s, std::move(on_timeout));
}

void stop_collective_watchdog() { Watchdog::get().stop(); }

CollectiveWatch::CollectiveWatch(std::string_view op, std::string_view comm, int comm_rank,
                                 int comm_size)
    : id_(Watchdog::get().add(op, comm, comm_rank, comm_size)) {}

CollectiveWatch::~CollectiveWatch() {
  if (id_ != 0) Watchdog::get().remove(id_);
}

}  // namespace moepeak
