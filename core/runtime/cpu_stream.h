// CPU streams and events: a stream is a worker thread that runs its queue in order; events and
// waits order work across streams with CUDA's semantics (see stream.h).
//
// CPU ops submit their loops with `as_cpu_stream(stream).enqueue(...)`. A task that throws makes
// the stream's error sticky: later tasks are skipped and synchronize() rethrows, like a CUDA
// error surfacing at the next synchronisation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/runtime/stream.h"

namespace moepeak {

class CpuStream final : public Stream {
 public:
  // on_destroy (optional) runs in the destructor, after the queue has drained.
  explicit CpuStream(std::string name, std::function<void(CpuStream*)> on_destroy = {});
  ~CpuStream() override;  // finishes queued work, then joins the worker

  // Queues `work` (tagged for StreamProfile with this thread's traffic tag and op label). With
  // serial streams (stream_profile.h) the host then waits for it to finish.
  void enqueue(std::function<void()> work);
  // Queues bookkeeping that is not work (event records and waits): never recorded, never
  // waited for by serial streams.
  void enqueue_control(std::function<void()> control);
  void wait(const Event& event) override;
  void synchronize() override;
  void* native_handle() const override { return nullptr; }
  const std::string& name() const override { return name_; }

  // Sleeps this long before every task: tests slow a stream on purpose so that a missing wait
  // or a buffer reused before its copy finished shows up as a wrong result.
  void set_debug_delay(std::chrono::microseconds delay);

 private:
  struct Task {
    std::function<void()> fn;
    const char* traffic = nullptr;
    const char* op = nullptr;
    bool work = true;
  };
  void push(Task task);
  void run();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_idle_, cv_done_;
  std::deque<Task> queue_;
  uint64_t pushed_ = 0, finished_ = 0;  // tasks queued and run (or skipped) so far
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::chrono::microseconds delay_{0};
  std::function<void(CpuStream*)> on_destroy_;
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(EventTiming timing = EventTiming::off) : timing_(timing) {}
  void record(Stream& stream) override;
  void synchronize() override;
  bool query() override;
  double elapsed_ms(const Event& start) const override;

  // One record() call: done once the stream reaches it. Waits hold on to the record they saw.
  struct Mark {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::chrono::steady_clock::time_point when;
    void complete();
    void block();
  };
  std::shared_ptr<Mark> latest() const;

 private:
  EventTiming timing_;
  mutable std::mutex mu_;
  std::shared_ptr<Mark> latest_;
};

// Throws moepeak::Error if `stream` is not a CPU stream (e.g. a CUDA stream passed to a CPU op).
CpuStream& as_cpu_stream(Stream& stream);

}  // namespace moepeak
