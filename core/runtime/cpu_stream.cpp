#include "core/runtime/cpu_stream.h"

#include "core/error.h"
#include "core/runtime/stream_profile.h"

namespace moepeak {

CpuStream::CpuStream(std::string name, std::function<void(CpuStream*)> on_destroy)
    : name_(std::move(name)), on_destroy_(std::move(on_destroy)) {
  worker_ = std::thread([this] { run(); });
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  worker_.join();
  if (on_destroy_) on_destroy_(this);
}

namespace {
thread_local const CpuStream* t_worker_of = nullptr;  // the stream whose worker this thread is
}  // namespace

void CpuStream::push(Task task) {
  const bool wait = task.work && serial_streams() && t_worker_of == nullptr;
  uint64_t mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    mine = ++pushed_;
  }
  cv_work_.notify_one();
  if (wait) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return finished_ >= mine; });
  }
}

void CpuStream::enqueue(std::function<void()> work) {
  push({std::move(work), current_stream_traffic(), current_stream_op(), true});
}

void CpuStream::enqueue_control(std::function<void()> control) {
  push({std::move(control), nullptr, nullptr, false});
}

void CpuStream::run() {
  t_worker_of = this;
  for (;;) {
    Task task;
    std::chrono::microseconds delay;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      delay = delay_;
    }
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mu_);
      skip = error_ != nullptr;
    }
    if (!skip) {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      const bool record = task.work && StreamProfile::recording();
      const auto begin =
          record ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if (record) detail::begin_stream_task();
      try {
        task.fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
      }
      if (record) {
        detail::record_stream_span(name_, task.traffic, task.op, begin,
                                   std::chrono::steady_clock::now());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      ++finished_;
      cv_done_.notify_all();
      if (queue_.empty()) cv_idle_.notify_all();
    }
  }
}

void CpuStream::wait(const Event& event) {
  auto mark = dynamic_cast<const CpuEvent&>(event).latest();
  if (!mark) return;  // never recorded: no-op, as in CUDA
  enqueue_control([mark] { mark->block(); });
}

void CpuStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  if (error_) std::rethrow_exception(error_);
}

void CpuStream::set_debug_delay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay;
}

void CpuEvent::Mark::complete() {
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    when = std::chrono::steady_clock::now();
  }
  cv.notify_all();
}

void CpuEvent::Mark::block() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [this] { return done; });
}

void CpuEvent::record(Stream& stream) {
  auto mark = std::make_shared<Mark>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = mark;
  }
  as_cpu_stream(stream).enqueue_control([mark] { mark->complete(); });
}

std::shared_ptr<CpuEvent::Mark> CpuEvent::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void CpuEvent::synchronize() {
  auto mark = latest();
  if (mark) mark->block();
}

bool CpuEvent::query() {
  auto mark = latest();
  if (!mark) return true;
  std::lock_guard<std::mutex> lock(mark->mu);
  return mark->done;
}

double CpuEvent::elapsed_ms(const Event& start) const {
  // NOTES: the CPU keeps CUDA's rule (no timing on an EventTiming::off event) so that a timing
  // call site that forgot EventTiming::on fails in the CPU tests, not first on a GPU.
  MOEPEAK_CHECK(
      timing_ == EventTiming::on && dynamic_cast<const CpuEvent&>(start).timing_ == EventTiming::on,
      "elapsed_ms on an event created without timing (create_event(EventTiming::on))");
  auto end_mark = latest();
  auto start_mark = dynamic_cast<const CpuEvent&>(start).latest();
  MOEPEAK_CHECK(end_mark && start_mark, "elapsed_ms on an event that was never recorded");
  auto finished_at = [](CpuEvent::Mark& m, const char* which) {
    std::lock_guard<std::mutex> lock(m.mu);
    MOEPEAK_CHECK(m.done, "elapsed_ms: ", which, " event has not completed");
    return m.when;
  };
  auto t0 = finished_at(*start_mark, "start");
  auto t1 = finished_at(*end_mark, "end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

CpuStream& as_cpu_stream(Stream& stream) {
  auto* s = dynamic_cast<CpuStream*>(&stream);
  MOEPEAK_CHECK(s != nullptr, "stream '", stream.name(), "' is not a CPU stream");
  return *s;
}

}  // namespace moepeak
