// StreamProfile and serial streams (core/runtime/stream_profile.h): interval arithmetic on
// hand-made spans; what a recording holds (stream, traffic tag, op label; no event bookkeeping);
// serial streams run two streams' tasks one after the other, in the host's order, keep event
// semantics, and do not wait for a task a stream's worker enqueues; a Comm labels its tasks
// (one rank: SingleComm does nothing on a stream, so the label is checked on MpiComm in
// tests/comm/test_comm_link.cpp).
//
//     ctest -R test_stream_profile --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "core/runtime/stream_profile.h"

namespace moepeak {
namespace {

using namespace std::chrono_literals;

TEST(StreamProfileIntervals, CoveredAndUncovered) {
  EXPECT_DOUBLE_EQ(covered_seconds({}), 0.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{0, 1}, {0.5, 2}, {3, 4}}), 3.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{3, 4}, {0, 1}, {1, 2}}), 3.0);  // unsorted, touching
  EXPECT_DOUBLE_EQ(covered_seconds({{1, 1}, {2, 1}}), 0.0);          // empty and reversed
  // Spans [0, 4) and [6, 8); cover [1, 2), [3, 7): uncovered [0, 1), [2, 3), [7, 8).
  EXPECT_DOUBLE_EQ(uncovered_seconds({{0, 4}, {6, 8}}, {{1, 2}, {3, 7}}), 3.0);
  EXPECT_DOUBLE_EQ(uncovered_seconds({{0, 4}}, {}), 4.0);
  EXPECT_DOUBLE_EQ(uncovered_seconds({{0, 4}}, {{-1, 5}}), 0.0);
  EXPECT_DOUBLE_EQ(uncovered_seconds({{0, 1}, {2, 3}}, {{0.5, 2.5}}), 1.0);
  EXPECT_DOUBLE_EQ(uncovered_seconds({{0, 10}}, {{1, 2}, {1.5, 3}, {9, 12}}), 7.0);  // [0,1) [3,9)
}

struct ProfileFixture : ::testing::Test {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  std::unique_ptr<Stream> a = backend->create_stream("stream a");
  std::unique_ptr<Stream> b = backend->create_stream("stream b");
  void TearDown() override {
    set_serial_streams(false);
    StreamProfile::stop();
  }
};

TEST_F(ProfileFixture, RecordsTasksWithTheirTagsButNotEventBookkeeping) {
  std::unique_ptr<Event> done = backend->create_event();
  as_cpu_stream(*a).enqueue([] {});  // before start: not recorded
  a->synchronize();
  StreamProfile::start();
  EXPECT_TRUE(StreamProfile::recording());
  as_cpu_stream(*a).enqueue([] { std::this_thread::sleep_for(2ms); });
  {
    const StreamTrafficTag outer("zero gather");
    {
      const StreamTrafficTag inner("dispatch");
      const StreamOpLabel op("all_to_all_v");
      as_cpu_stream(*b).enqueue([] {});
    }
    EXPECT_STREQ(current_stream_traffic(), "zero gather");
    EXPECT_EQ(current_stream_op(), nullptr);
    as_cpu_stream(*a).enqueue([] {});
  }
  EXPECT_EQ(current_stream_traffic(), nullptr);
  done->record(*a);
  b->wait(*done);
  a->synchronize();
  b->synchronize();
  std::vector<StreamSpan> spans = StreamProfile::stop();
  EXPECT_FALSE(StreamProfile::recording());
  ASSERT_EQ(spans.size(), 3u);  // the record and the wait are not work
  std::sort(spans.begin(), spans.end(),
            [](const StreamSpan& x, const StreamSpan& y) { return x.begin_s < y.begin_s; });
  const auto on_b = std::find_if(spans.begin(), spans.end(),
                                 [](const StreamSpan& s) { return s.stream == "stream b"; });
  ASSERT_NE(on_b, spans.end());
  EXPECT_EQ(on_b->traffic, "dispatch");
  EXPECT_EQ(on_b->op, "all_to_all_v");
  EXPECT_TRUE(on_b->is_comm());
  // Stream a's first task is the 2 ms sleep (a stream runs its tasks in order); stream b's task
  // may begin before it does (the streams' threads race), so it is found by stream, not rank.
  const auto first_a = std::find_if(spans.begin(), spans.end(),
                                    [](const StreamSpan& s) { return s.stream == "stream a"; });
  ASSERT_NE(first_a, spans.end());
  EXPECT_EQ(first_a->traffic, "");
  EXPECT_FALSE(first_a->is_comm());
  EXPECT_GE(first_a->end_s - first_a->begin_s, 0.002);
  EXPECT_LE(first_a->begin_s, first_a->end_s);
  // Nothing is recorded once stopped.
  as_cpu_stream(*a).enqueue([] {});
  a->synchronize();
  EXPECT_TRUE(StreamProfile::stop().empty());
}

TEST_F(ProfileFixture, SerialStreamsRunOneTaskAtATimeInTheHostsOrder) {
  // Two streams, each with tasks that sleep: serial, no two spans overlap and they start in the
  // order enqueued; the enqueue itself returns only once its task has run.
  set_serial_streams(true);
  StreamProfile::start();
  std::atomic<int> ran{0};
  for (int i = 0; i < 6; ++i) {
    Stream& s = i % 2 ? *b : *a;
    as_cpu_stream(s).enqueue([&ran] {
      std::this_thread::sleep_for(5ms);
      ++ran;
    });
    EXPECT_EQ(ran.load(), i + 1) << "the host went on before task " << i << " ran";
  }
  std::vector<StreamSpan> spans = StreamProfile::stop();
  ASSERT_EQ(spans.size(), 6u);
  std::vector<Interval> on_a, on_b;
  for (const StreamSpan& s : spans)
    (s.stream == "stream a" ? on_a : on_b).push_back({s.begin_s, s.end_s});
  EXPECT_DOUBLE_EQ(uncovered_seconds(on_a, on_b), covered_seconds(on_a));
  std::sort(spans.begin(), spans.end(),
            [](const StreamSpan& x, const StreamSpan& y) { return x.begin_s < y.begin_s; });
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].stream, i % 2 ? "stream b" : "stream a") << i;
    if (i > 0) {
      EXPECT_GE(spans[i].begin_s, spans[i - 1].end_s) << i;
    }
  }
}

TEST_F(ProfileFixture, SerialStreamsKeepEventsAndDoNotWaitForWorkerEnqueues) {
  set_serial_streams(true);
  std::unique_ptr<Event> ready = backend->create_event();
  int value = 0, seen = -1;
  as_cpu_stream(*a).enqueue([&] { value = 7; });
  ready->record(*a);
  b->wait(*ready);
  as_cpu_stream(*b).enqueue([&] { seen = value; });
  EXPECT_EQ(seen, 7);
  // A task that enqueues on its own stream: the inner task runs after it, not waited for.
  std::atomic<bool> inner{false};
  CpuStream& sa = as_cpu_stream(*a);
  sa.enqueue([&] { sa.enqueue([&] { inner = true; }); });
  a->synchronize();
  EXPECT_TRUE(inner.load());
}

}  // namespace
}  // namespace moepeak
