// Stream timelines on the CPU backend, for benchmarks that ask whether communication hides
// behind compute (`moepeak bench overlap`, docs/perf.md):
//
//   - a process-wide recording of every task a CpuStream runs: its stream, its traffic class
//     (StreamTrafficTag, set by the code that issues it), whether it is a communication
//     operation (the Comm labels its own tasks, StreamOpLabel) and when it started and ended;
//     waits on events and event records are not recorded (they are not work);
//   - serial streams: the host waits for every task it enqueues to finish before it goes on, so
//     no two tasks of a process ever run at once — the same schedule with every wait made
//     blocking, the baseline overlap is measured against;
//   - interval arithmetic over the recorded spans (covered, uncovered by others).
//
// Both switches are off by default and cost one relaxed atomic load per task when off. They
// are process-wide: a benchmark turns them on around the steps it measures.
//
// NOTES: serial streams keep every stream's order and every event's meaning (an event is
// recorded before any wait on it is enqueued, and with serial streams the record has run by
// then), and they cannot deadlock a collective: each rank's host issues the same operations in
// the same order, and now runs them in that order too. A task enqueued from a stream's own
// worker thread is not waited for (it could not run until the current one returns).
//
// Test: tests/runtime/test_stream_profile.cpp
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace moepeak {

// One task a stream ran, in seconds since StreamProfile::start.
struct StreamSpan {
  std::string stream;   // the stream's name
  std::string traffic;  // StreamTrafficTag at enqueue ("" when none)
  std::string op;       // StreamOpLabel at enqueue: a Comm operation ("" for compute)
  double begin_s = 0, end_s = 0;
  double link_s = 0;  // what the link model charged the operation (0 with it off)
  bool is_comm() const { return !op.empty(); }
};

class StreamProfile {
 public:
  // Clears what was recorded and begins recording (every CpuStream of the process).
  static void start();
  // Ends recording and returns the spans (by end time per stream; unordered across streams).
  static std::vector<StreamSpan> stop();
  static bool recording();
};

// The host waits for every CPU stream task it enqueues (see above).
void set_serial_streams(bool on);
bool serial_streams();

// While one lives, the tasks this thread enqueues carry `traffic` (nested tags: the innermost).
// `traffic` must outlive the tag (a string literal).
class StreamTrafficTag {
 public:
  explicit StreamTrafficTag(const char* traffic);
  ~StreamTrafficTag();
  StreamTrafficTag(const StreamTrafficTag&) = delete;
  StreamTrafficTag& operator=(const StreamTrafficTag&) = delete;

 private:
  const char* saved_;
};

// The same for the Comm operation a task is (the Comm sets it around its enqueue).
class StreamOpLabel {
 public:
  explicit StreamOpLabel(const char* op);
  ~StreamOpLabel();
  StreamOpLabel(const StreamOpLabel&) = delete;
  StreamOpLabel& operator=(const StreamOpLabel&) = delete;

 private:
  const char* saved_;
};

// What a task enqueued now by this thread would carry (nullptr when none).
const char* current_stream_traffic();
const char* current_stream_op();

// Intervals [begin, end) in seconds.
using Interval = std::pair<double, double>;
// The length of their union.
double covered_seconds(std::vector<Interval> spans);
// The length of union(spans) minus union(cover): the time spans run with no cover running.
double uncovered_seconds(std::vector<Interval> spans, std::vector<Interval> cover);

// Called inside a running task: the link model charged it `seconds` (MpiComm).
void note_task_link_seconds(double seconds);

namespace detail {
// CpuStream's hooks: a task starts (clears the link charge), one task ran (a no-op unless
// recording).
void begin_stream_task();
void record_stream_span(const std::string& stream, const char* traffic, const char* op,
                        std::chrono::steady_clock::time_point begin,
                        std::chrono::steady_clock::time_point end);
}  // namespace detail

}  // namespace moepeak
