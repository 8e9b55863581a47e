// StreamProfile, serial streams, task tags and interval arithmetic (see the header); CpuStream
// (cpu_stream.cpp) calls detail::record_stream_span and reads the switches.
// Test: tests/runtime/test_stream_profile.cpp
#include "core/runtime/stream_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "core/runtime/cpu_stream.h"

namespace moepeak {
namespace {

std::atomic<bool> g_recording{false};
std::atomic<bool> g_serial{false};
std::mutex g_mu;
std::vector<StreamSpan> g_spans;
std::chrono::steady_clock::time_point g_origin;

thread_local const char* t_traffic = nullptr;
thread_local const char* t_op = nullptr;
thread_local double t_link_s = 0;

// Sorted, merged intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

}  // namespace

void StreamProfile::start() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_spans.clear();
  g_origin = std::chrono::steady_clock::now();
  g_recording.store(true);
}

std::vector<StreamSpan> StreamProfile::stop() {
  g_recording.store(false);
  std::lock_guard<std::mutex> lock(g_mu);
  return std::move(g_spans);
}

bool StreamProfile::recording() { return g_recording.load(std::memory_order_relaxed); }

void detail::record_stream_span(const std::string& stream, const char* traffic, const char* op,
                                std::chrono::steady_clock::time_point begin,
                                std::chrono::steady_clock::time_point end) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_recording.load()) return;
  auto s = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t - g_origin).count();
  };
  g_spans.push_back({stream, traffic ? traffic : "", op ? op : "", s(begin), s(end), t_link_s});
}

void detail::begin_stream_task() { t_link_s = 0; }
void note_task_link_seconds(double seconds) { t_link_s += seconds; }

void set_serial_streams(bool on) { g_serial.store(on); }
bool serial_streams() { return g_serial.load(std::memory_order_relaxed); }

StreamTrafficTag::StreamTrafficTag(const char* traffic) : saved_(t_traffic) { t_traffic = traffic; }
StreamTrafficTag::~StreamTrafficTag() { t_traffic = saved_; }
StreamOpLabel::StreamOpLabel(const char* op) : saved_(t_op) { t_op = op; }
StreamOpLabel::~StreamOpLabel() { t_op = saved_; }

const char* current_stream_traffic() { return t_traffic; }
const char* current_stream_op() { return t_op; }

double covered_seconds(std::vector<Interval> spans) {
  double total = 0;
  for (const Interval& i : merged(std::move(spans))) total += i.second - i.first;
  return total;
}

double uncovered_seconds(std::vector<Interval> spans, std::vector<Interval> cover) {
  const std::vector<Interval> a = merged(std::move(spans)), c = merged(std::move(cover));
  double total = 0;
  size_t j = 0;
  for (const Interval& i : a) {
    double at = i.first;
    while (j < c.size() && c[j].second <= at) ++j;
    for (size_t k = j; k < c.size() && c[k].first < i.second; ++k) {
      if (c[k].first > at) total += c[k].first - at;
      at = std::max(at, c[k].second);
      if (at >= i.second) break;
    }
    if (at < i.second) total += i.second - at;
  }
  return total;
}

}  // namespace moepeak
