// The collective watchdog (core/comm/watchdog.h) in one process, with a handler in place of the
// job's abort: an operation past the timeout is reported once, with the rank, the operation, the
// communicator and the step; operations that complete in time, and a watchdog that is off,
// report nothing. The whole job's behaviour (MPI_Abort, exit 3) is in tests/faults.
// Run: ctest -R test_watchdog
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "core/comm/watchdog.h"
#include "core/run_context.h"

namespace moepeak {
namespace {

using namespace std::chrono_literals;

struct Reports {
  std::mutex mu;
  std::string message;
  std::atomic<int> count{0};
  void add(const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    message = m;
    ++count;
  }
};

TEST(CollectiveWatchdog, AnOperationPastTheTimeoutIsNamedOnce) {
  Reports reports;
  run_context::set_rank(3);
  run_context::set_step(7);
  start_collective_watchdog(0.2, [&](const std::string& m) { reports.add(m); });
  {
    const CollectiveWatch quick("broadcast", "world", 3, 4);  // done in time: not reported
  }
  {
    const CollectiveWatch slow("all_gather", "expert", 1, 2);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (reports.count == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(300ms);  // no second report: the watchdog stops after one
  stop_collective_watchdog();
  ASSERT_EQ(reports.count, 1);
  EXPECT_NE(reports.message.find("collective watchdog: rank 3: all_gather on communicator "
                                 "'expert' (rank 1 of 2) has not completed after"),
            std::string::npos)
      << reports.message;
  EXPECT_NE(reports.message.find("runtime.collective_timeout = 0.2 s"), std::string::npos)
      << reports.message;
  EXPECT_NE(reports.message.find("at step 7"), std::string::npos) << reports.message;
  run_context::set_step(0);
}

TEST(CollectiveWatchdog, OperationsInTimeAndAnOffWatchdogReportNothing) {
  Reports reports;
  start_collective_watchdog(0.3, [&](const std::string& m) { reports.add(m); });
  for (int i = 0; i < 20; ++i) {
    const CollectiveWatch op("all_reduce", "world", 0, 2);
    std::this_thread::sleep_for(20ms);  // each well inside the timeout, 400 ms in all
  }
  stop_collective_watchdog();
  start_collective_watchdog(0, [&](const std::string& m) { reports.add(m); });  // 0 = off
  {
    const CollectiveWatch op("all_reduce", "world", 0, 2);
    std::this_thread::sleep_for(400ms);
  }
  stop_collective_watchdog();
  EXPECT_EQ(reports.count, 0) << reports.message;
}

TEST(CollectiveWatchdog, SetupIsNamedWhenNoStepRuns) {
  Reports reports;
  run_context::set_step(0);
  start_collective_watchdog(0.1, [&](const std::string& m) { reports.add(m); });
  {
    const CollectiveWatch op("barrier", "world", 0, 2);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (reports.count == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(10ms);
  }
  stop_collective_watchdog();
  ASSERT_EQ(reports.count, 1);
  EXPECT_NE(reports.message.find("during setup"), std::string::npos) << reports.message;
}

}  // namespace
}  // namespace moepeak
