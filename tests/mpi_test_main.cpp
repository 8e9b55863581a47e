// GoogleTest main for multi-rank tests (moepeak_add_mpi_test in tests/CMakeLists.txt), run as
//
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/comm/test_comm_mpi
//
// Every rank runs every test in the same order. Rank 0 prints GoogleTest's usual report; the other
// ranks print only their failures, each line prefixed "[rank r]", so a failure on rank 3 is not
// lost. The exit code is the maximum over ranks, so any failing rank fails the run.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "core/comm/process_group.h"
#include "core/error.h"

namespace {

// Reports the failures of a rank other than 0 (whose default printer has been removed).
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  moepeak::RankInfo ranks;
  try {
    ranks = moepeak::init_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "init_process_group failed: %s\n", e.what());
    return 2;
  }
  if (ranks.rank != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(ranks.rank));
  }

  int result = RUN_ALL_TESTS();

  if (moepeak::process_group_uses_mpi()) {
    int worst = result;
    MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    result = worst;
  }
  try {
    moepeak::finalize_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finalize_process_group failed: %s\n", e.what());
    if (result == 0) result = 2;
  }
  return result;
}
