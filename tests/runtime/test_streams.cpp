// CPU streams and events: in-order execution, cross-stream ordering through events with CUDA's
// semantics, sticky errors, timing. Run: ctest -R test_streams
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"

namespace moepeak {
namespace {

using namespace std::chrono_literals;

struct StreamFixture : ::testing::Test {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  std::unique_ptr<Stream> producer = backend->create_stream("producer");
  std::unique_ptr<Stream> consumer = backend->create_stream("consumer");
};

TEST_F(StreamFixture, RunsWorkInSubmissionOrder) {
  std::vector<int> seen;
  auto& s = as_cpu_stream(*producer);
  for (int i = 0; i < 100; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
}

// The producer is slowed on purpose; the consumer copies the producer's output. With the wait,
// the copy must see the produced value. The second half shows the same program without the wait
// reads the stale value, so the first half would fail if wait() did not order work.
TEST_F(StreamFixture, CrossStreamWaitOrdersWork) {
  as_cpu_stream(*producer).set_debug_delay(
      500ms);  // long enough that a loaded CI machine still races
  auto src = backend->alloc(sizeof(int), LiveSet::workspace, "src");
  auto dst = backend->alloc(sizeof(int), LiveSet::workspace, "dst");
  auto event = backend->create_event();

  auto run = [&](bool with_wait) {
    *src.as<int>() = -1;
    *dst.as<int>() = 0;
    as_cpu_stream(*producer).enqueue([&] { *src.as<int>() = 42; });
    event->record(*producer);
    if (with_wait) consumer->wait(*event);
    backend->copy_async(dst.data(), src.data(), sizeof(int), CopyKind::device_to_device, *consumer);
    consumer->synchronize();
    int got = *dst.as<int>();
    producer->synchronize();
    return got;
  };
  EXPECT_EQ(run(true), 42);
#if !defined(__SANITIZE_THREAD__)
  // NOTES: the half without the wait is a data race on purpose; ThreadSanitizer (rightly) stops
  // the process on it, so a thread-sanitized build checks the ordered half only.
  EXPECT_EQ(run(false), -1) << "without the wait the consumer should have raced ahead";
#endif
}

// cudaStreamWaitEvent waits for the record that was latest when wait() was called; recording the
// event again afterwards must not release (or re-target) the earlier wait.
TEST_F(StreamFixture, WaitCapturesTheLatestRecordAtCallTime) {
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  auto event = backend->create_event();
  auto other = backend->create_stream("other");
  std::atomic<bool> consumer_ran{false};

  as_cpu_stream(*producer).enqueue([opened] { opened.wait(); });
  event->record(*producer);
  consumer->wait(*event);
  as_cpu_stream(*consumer).enqueue([&] { consumer_ran = true; });
  event->record(*other);  // completes at once
  other->synchronize();
  EXPECT_TRUE(event->query());  // the event now refers to the completed record
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(consumer_ran.load()) << "the wait was released by a later record";
  gate.set_value();
  consumer->synchronize();
  EXPECT_TRUE(consumer_ran.load());
}

TEST_F(StreamFixture, NeverRecordedEventIsNoOp) {
  auto event = backend->create_event();
  EXPECT_TRUE(event->query());
  consumer->wait(*event);
  event->synchronize();
  std::atomic<bool> ran{false};
  as_cpu_stream(*consumer).enqueue([&] { ran = true; });
  consumer->synchronize();
  EXPECT_TRUE(ran.load());
}

TEST_F(StreamFixture, EventSynchronizeAndQuery) {
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  auto event = backend->create_event();
  as_cpu_stream(*producer).enqueue([opened] { opened.wait(); });
  event->record(*producer);
  EXPECT_FALSE(event->query());
  gate.set_value();
  event->synchronize();
  EXPECT_TRUE(event->query());
}

TEST_F(StreamFixture, ElapsedTimeMeasuresWorkBetweenEvents) {
  auto start = backend->create_event(EventTiming::on);
  auto end = backend->create_event(EventTiming::on);
  start->record(*producer);
  as_cpu_stream(*producer).enqueue([] { std::this_thread::sleep_for(30ms); });
  end->record(*producer);
  end->synchronize();
  EXPECT_GE(end->elapsed_ms(*start), 29.0);
  auto unrecorded = backend->create_event(EventTiming::on);
  EXPECT_THROW(unrecorded->elapsed_ms(*start), Error);
  // An ordering-only event (the default) cannot time, on either end of the pair.
  auto untimed = backend->create_event();
  untimed->record(*producer);
  untimed->synchronize();
  EXPECT_THROW(untimed->elapsed_ms(*start), Error);
  EXPECT_THROW(end->elapsed_ms(*untimed), Error);
}

TEST_F(StreamFixture, ErrorsAreStickyAndSurfaceAtSynchronize) {
  std::atomic<int> after{0};
  auto& s = as_cpu_stream(*producer);
  s.enqueue([] { MOEPEAK_THROW("kernel failed"); });
  s.enqueue([&] { after = 1; });
  try {
    s.synchronize();
    FAIL() << "expected the stream's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel failed"), std::string::npos);
  }
  EXPECT_EQ(after.load(), 0) << "work after a failure must not run";
  EXPECT_THROW(s.synchronize(), Error);
}

TEST_F(StreamFixture, BackendSynchronizeWaitsForEveryStream) {
  std::atomic<int> done{0};
  as_cpu_stream(*producer).enqueue([&] {
    std::this_thread::sleep_for(50ms);
    ++done;
  });
  as_cpu_stream(*consumer).enqueue([&] {
    std::this_thread::sleep_for(50ms);
    ++done;
  });
  as_cpu_stream(backend->default_stream()).enqueue([&] { ++done; });
  backend->synchronize();
  EXPECT_EQ(done.load(), 3);
}

TEST_F(StreamFixture, CopiesAndMemsetThroughTheBackend) {
  auto host = backend->pinned().alloc(64, LiveSet::boundaries, "host");
  auto dev = backend->alloc(64, LiveSet::boundaries, "dev");
  backend->memset_async(host.data(), 7, 64, *producer);
  backend->copy_async(dev.data(), host.data(), 64, CopyKind::host_to_device, *producer);
  backend->memset_async(host.data(), 0, 64, *producer);
  backend->copy_async(host.data(), dev.data(), 32, CopyKind::device_to_host, *producer);
  producer->synchronize();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(host.as<unsigned char>()[i], 7);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(host.as<unsigned char>()[i], 0);
}

TEST(CpuBackend, CapacityIsTheConfiguredDeviceMemory) {
  BackendOptions opts;
  opts.device_memory = 64ull << 20;
  auto backend = Backend::create(opts);
  EXPECT_EQ(backend->kind(), BackendKind::cpu);
  MemoryInfo info = backend->memory_info();
  EXPECT_EQ(info.capacity, 64ull << 20);
  EXPECT_EQ(info.used, 0u);
  EXPECT_GT(info.physical_total, 0u);
  auto a = backend->alloc(48ull << 20, LiveSet::weights, "weights");
  EXPECT_THROW(backend->alloc(32ull << 20, LiveSet::logits, "logits"), Error);
  EXPECT_NE(backend->describe().find("64.00 MiB"), std::string::npos) << backend->describe();
}

TEST(CpuBackend, LargeVirtualCapacityCostsNothingUntilTouched) {
  BackendOptions opts;
  opts.device_memory = 80ull << 30;  // an "H100" on a 24 GiB machine: reserved, not committed
  auto backend = Backend::create(opts);
  EXPECT_EQ(backend->memory_info().capacity, 80ull << 30);
  auto b = backend->alloc(1 << 20, LiveSet::workspace, "small");
  std::memset(b.data(), 1, b.bytes());
}

}  // namespace
}  // namespace moepeak
