// MpiComm on real rank processes: every collective against what each rank computes locally from
// seeded data (comm_checks.h), for f32, f64, bf16, i32 and i64; the chunked paths taken above
// INT_MAX elements (forced with a small per-call limit); two communicators on two streams at
// once; barrier; rank discovery; and MPI errors turned into moepeak::Error.
//
//     ctest -R test_comm_mpi --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/comm/test_comm_mpi
//
// Written for any world size >= 2 (registered with 4 ranks; 2 cores serve them, so shapes are
// small).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>

#include "core/comm/mpi_comm.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "tests/comm/comm_checks.h"

namespace moepeak {
namespace {

using namespace testing_comm;

class MpiCommTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ranks_ = init_process_group();
    comm_ = std::make_unique<MpiComm>(MPI_COMM_WORLD, ranks_);
  }
  static void TearDownTestSuite() { comm_.reset(); }

  static RankInfo ranks_;
  static std::unique_ptr<MpiComm> comm_;
  CpuStream stream_{"comm-test"};
  HostTestMemory mem_;
};
RankInfo MpiCommTest::ranks_;
std::unique_ptr<MpiComm> MpiCommTest::comm_;

TEST_F(MpiCommTest, RankInfoAgreesWithMpiAndTheLauncher) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_GE(size, 2) << "run this test under mpirun with at least 2 ranks";
  EXPECT_EQ(ranks_.rank, rank);
  EXPECT_EQ(ranks_.world_size, size);
  EXPECT_GE(ranks_.local_rank, 0);
  EXPECT_LT(ranks_.local_rank, ranks_.local_size);
  EXPECT_LE(ranks_.local_size, ranks_.world_size);
  EXPECT_FALSE(ranks_.host.empty());
  EXPECT_EQ(process_rank(), rank);  // set_process_identity was called
  EXPECT_TRUE(process_group_uses_mpi());
  // The local rank comes from the launcher (OMPI_COMM_WORLD_LOCAL_RANK under mpirun,
  // SLURM_LOCALID under srun) and agreed with MPI's shared-memory communicator, or the source
  // would name that communicator.
  const LauncherEnv& launcher = process_group_launcher_env();
  EXPECT_TRUE(launcher.launched()) << launcher.describe();
  if (launcher.local_rank) {
    EXPECT_EQ(local_rank_source(), "launcher (" + launcher.local_rank_var + ")");
  }
  // Idempotent: a second call returns the same identity.
  RankInfo again = init_process_group();
  EXPECT_EQ(again.rank, ranks_.rank);
  EXPECT_EQ(again.local_rank, ranks_.local_rank);
  EXPECT_EQ(comm_->kind(), "mpi");
  EXPECT_EQ(comm_->rank(), rank);
}

TEST_F(MpiCommTest, EveryOperationF32) { check_every_operation<float>(*comm_, stream_, mem_, 100); }
TEST_F(MpiCommTest, EveryOperationF64) {
  check_every_operation<double>(*comm_, stream_, mem_, 200);
}
TEST_F(MpiCommTest, EveryOperationBf16) { check_every_operation<bf16>(*comm_, stream_, mem_, 300); }
TEST_F(MpiCommTest, EveryOperationI32) {
  check_every_operation<int32_t>(*comm_, stream_, mem_, 400);
}
TEST_F(MpiCommTest, EveryOperationI64) {
  check_every_operation<int64_t>(*comm_, stream_, mem_, 500);
}

TEST_F(MpiCommTest, SplitGroupsByColorRankedByKey) {
  check_split(*comm_, stream_, mem_, 2, 1000);                    // {3, 1} and {2, 0} on four ranks
  check_split(*comm_, stream_, mem_, 1, 1001);                    // everyone, reversed
  check_split(*comm_, stream_, mem_, comm_->world_size(), 1002);  // each rank alone
}

TEST_F(MpiCommTest, ChunkedPathsAboveThePerCallLimitGiveTheSameResults) {
  // The paths taken for counts above INT_MAX, exercised with a limit of 3 elements per call.
  std::unique_ptr<Comm> dup = comm_->duplicate();
  auto& chunked = dynamic_cast<MpiComm&>(*dup);
  chunked.set_max_elements_per_call(3);
  EXPECT_EQ(chunked.max_elements_per_call(), 3u);
  check_every_operation<float>(chunked, stream_, mem_, 600);
  check_every_operation<bf16>(chunked, stream_, mem_, 700);
  check_every_operation<int64_t>(chunked, stream_, mem_, 800);
  // Exactly at, and one past, a multiple of the limit.
  check_all_reduce<double>(chunked, stream_, mem_, 9, ReduceOp::sum, false, 900);
  check_all_reduce<double>(chunked, stream_, mem_, 10, ReduceOp::sum, true, 901);
  check_all_gather<double>(chunked, stream_, mem_, 3, true, 902);
  check_reduce_scatter<double>(chunked, stream_, mem_, 4, ReduceOp::max, true, 903);
  check_send_recv_pairs<double>(chunked, stream_, mem_, 7, 904);
}

// runtime.cpu_comm_wait = "poll": every operation through MPI's non-blocking calls, completed by
// MPI_Testall between sleeps; results as the blocking path's, chunked paths included.
std::unique_ptr<Comm> polling_duplicate(MpiComm& comm) {
  std::unique_ptr<Comm> dup = comm.duplicate();
  dynamic_cast<MpiComm&>(*dup).set_link_model({0, 0, /*poll_waits=*/true});
  return dup;
}

TEST_F(MpiCommTest, EveryOperationWithPolledWaits) {
  std::unique_ptr<Comm> polled = polling_duplicate(*comm_);
  check_every_operation<float>(*polled, stream_, mem_, 1100);
  check_every_operation<bf16>(*polled, stream_, mem_, 1101);
  check_every_operation<int64_t>(*polled, stream_, mem_, 1102);
  check_split(*polled, stream_, mem_, 2, 1103);
  auto& chunked = dynamic_cast<MpiComm&>(*polled);
  chunked.set_max_elements_per_call(3);
  check_every_operation<double>(chunked, stream_, mem_, 1104);
}

TEST_F(MpiCommTest, APolledWaitLeavesTheCoreWhileItsPeerIsLate) {
  // Rank 1 sends 300 ms late; rank 0's receive waits by polling, so its process spends a small
  // part of that wait on the CPU (MPI's blocking receive would spin through all of it).
  std::unique_ptr<Comm> polled = polling_duplicate(*comm_);
  const int me = polled->rank();
  std::vector<float> buf(1000, static_cast<float>(me));
  polled->barrier();
  if (me == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    polled->send(buf.data(), buf.size(), DType::f32, 0, stream_);
    stream_.synchronize();
  } else if (me == 0) {
    timespec cpu0{}, cpu1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    const auto t0 = std::chrono::steady_clock::now();
    polled->recv(buf.data(), buf.size(), DType::f32, 1, stream_);
    stream_.synchronize();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    const double cpu = (cpu1.tv_sec - cpu0.tv_sec) + 1e-9 * (cpu1.tv_nsec - cpu0.tv_nsec);
    EXPECT_GE(wall, 0.25) << "the receive finished before its peer sent";
    EXPECT_LT(cpu, 0.2 * wall) << "the polled wait spent " << cpu << " s of CPU in " << wall
                               << " s";
    EXPECT_EQ(buf[999], 1.0f);
  }
  polled->barrier();
}

TEST_F(MpiCommTest, PerCallLimitOutsideTheIntRangeIsAnError) {
  std::unique_ptr<Comm> dup = comm_->duplicate();
  auto& mpi = dynamic_cast<MpiComm&>(*dup);
  EXPECT_EQ(mpi.max_elements_per_call(), static_cast<size_t>(INT_MAX));
  EXPECT_THROW(mpi.set_max_elements_per_call(0), Error);
  EXPECT_THROW(mpi.set_max_elements_per_call(static_cast<size_t>(INT_MAX) + 1), Error);
}

TEST_F(MpiCommTest, ZeroCountsAreNoOps) {
  float x = 1.0f;
  comm_->all_reduce(&x, &x, 0, DType::f32, ReduceOp::sum, stream_);
  comm_->all_gather(&x, &x, 0, DType::f32, stream_);
  comm_->reduce_scatter(&x, &x, 0, DType::f32, ReduceOp::sum, stream_);
  comm_->broadcast(&x, 0, DType::f32, 0, stream_);
  stream_.synchronize();
  EXPECT_EQ(x, 1.0f);
}

TEST_F(MpiCommTest, InPlaceReduceScatterSumsInTheOrderOfOutOfPlace) {
  // ZeroParamStore reduce-scatters gradients in place (no temporary): on random data, whose sums
  // round differently in another order, the in-place result is bitwise the out-of-place one, at
  // sizes on both sides of MPI's algorithm switches; in a Comm group too.
  std::mt19937 gen(1234 + static_cast<unsigned>(comm_->rank()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t W = static_cast<size_t>(comm_->world_size()),
               me = static_cast<size_t>(comm_->rank());
  for (size_t count : {7ul, 1000ul, 70000ul}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<float> send(W * count);
    for (float& x : send) x = u(gen);
    std::vector<float> out(count), in_place = send, grouped = send;
    comm_->reduce_scatter(send.data(), out.data(), count, DType::f32, ReduceOp::sum, stream_);
    comm_->reduce_scatter(in_place.data(), in_place.data() + me * count, count, DType::f32,
                          ReduceOp::sum, stream_);
    {
      CommGroup group(*comm_);
      comm_->reduce_scatter(grouped.data(), grouped.data() + me * count, count, DType::f32,
                            ReduceOp::sum, stream_);
      group.end();
    }
    stream_.synchronize();
    EXPECT_EQ(std::memcmp(out.data(), in_place.data() + me * count, count * 4), 0);
    EXPECT_EQ(std::memcmp(out.data(), grouped.data() + me * count, count * 4), 0);
  }
}

TEST_F(MpiCommTest, SendrecvToItselfIsACopy) {
  const int me = comm_->rank();
  std::vector<int64_t> src = rank_data<int64_t>(77, me, 6), dst(6, 0);
  comm_->sendrecv(src.data(), src.size(), me, dst.data(), dst.size(), me, DType::i64, stream_);
  stream_.synchronize();
  EXPECT_EQ(dst, src);
}

TEST_F(MpiCommTest, TwoCommunicatorsOnTwoStreamsRunConcurrently) {
  // Stream A runs all_reduces on comm A while stream B runs all_gathers and ring shifts on comm B.
  // Even ranks submit B's work first and slow stream A down, odd ranks the other way round, so
  // the two communicators' operations interleave differently on each rank: with one
  // communicator, or one thread for both, this would deadlock.
  std::unique_ptr<Comm> comm_b = comm_->duplicate();
  CpuStream stream_a("comm-a"), stream_b("comm-b");
  const int me = comm_->rank(), world = comm_->world_size();
  (me % 2 == 0 ? stream_a : stream_b).set_debug_delay(std::chrono::microseconds(2000));
  constexpr int kRounds = 6;
  constexpr size_t kCount = 33;
  std::vector<std::vector<float>> a_send(kRounds), a_recv(kRounds, std::vector<float>(kCount));
  std::vector<std::vector<double>> b_send(kRounds),
      b_recv(kRounds, std::vector<double>(kCount * world));
  auto submit_a = [&](int round) {
    a_send[round] = rank_data<float>(1000 + round, me, kCount);
    comm_->all_reduce(a_send[round].data(), a_recv[round].data(), kCount, DType::f32, ReduceOp::sum,
                      stream_a);
  };
  auto submit_b = [&](int round) {
    b_send[round] = rank_data<double>(2000 + round, me, kCount);
    comm_b->all_gather(b_send[round].data(), b_recv[round].data(), kCount, DType::f64, stream_b);
  };
  for (int round = 0; round < kRounds; ++round) {
    if (me % 2 == 0) {
      submit_b(round);
      submit_a(round);
    } else {
      submit_a(round);
      submit_b(round);
    }
  }
  stream_a.synchronize();
  stream_b.synchronize();
  for (int round = 0; round < kRounds; ++round) {
    std::vector<double> expect_a(kCount), expect_b(kCount * world);
    for (size_t i = 0; i < kCount; ++i)
      expect_a[i] = reduced<float>(1000 + round, world, i, ReduceOp::sum);
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        expect_b[r * kCount + i] = value<double>(2000 + round, r, i);
      }
    }
    EXPECT_TRUE(same_values(a_recv[round], expect_a)) << "round " << round;
    EXPECT_TRUE(same_values(b_recv[round], expect_b)) << "round " << round;
  }
}

TEST_F(MpiCommTest, BarrierHoldsEveryRankUntilTheLastArrives) {
  comm_->barrier();  // line up
  constexpr auto kLateBy = std::chrono::milliseconds(300);
  auto start = std::chrono::steady_clock::now();
  if (comm_->rank() == 0) std::this_thread::sleep_for(kLateBy);
  comm_->barrier();
  auto waited = std::chrono::steady_clock::now() - start;
  // Every rank left the barrier only after rank 0 entered it, 300 ms after the first barrier.
  EXPECT_GE(waited, kLateBy - std::chrono::milliseconds(50));
}

TEST_F(MpiCommTest, MakeCommGivesMpiForTheCpuBackend) {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  std::unique_ptr<Comm> comm = make_comm(*backend, ranks_);
  EXPECT_EQ(comm->kind(), "mpi");
  check_all_reduce<float>(*comm, backend->default_stream(), mem_, 5, ReduceOp::sum, false, 42);
}

TEST_F(MpiCommTest, BadPeersAndRootsAreErrorsBeforeAnyMpiCall) {
  const int world = comm_->world_size(), me = comm_->rank();
  float buf[4] = {};
  EXPECT_THROW(comm_->send(buf, 4, DType::f32, world, stream_), Error);
  EXPECT_THROW(comm_->recv(buf, 4, DType::f32, -1, stream_), Error);
  EXPECT_THROW(comm_->send(buf, 4, DType::f32, me, stream_), Error);  // to itself: use sendrecv
  EXPECT_THROW(comm_->recv(buf, 4, DType::f32, me, stream_), Error);
  EXPECT_THROW(comm_->broadcast(buf, 4, DType::f32, world, stream_), Error);
  EXPECT_THROW(comm_->sendrecv(buf, 2, me, buf + 2, 2, (me + 1) % world, DType::f32, stream_),
               Error);
  std::vector<size_t> short_counts(world - 1, 0), counts(world, 0);
  EXPECT_THROW(
      comm_->all_to_all_v(buf, short_counts, counts, buf, counts, counts, DType::f32, stream_),
      Error);
  // Partly overlapping buffers are not one of the in-place forms.
  EXPECT_THROW(comm_->all_reduce(buf, buf + 1, 2, DType::f32, ReduceOp::sum, stream_), Error);
  try {
    comm_->send(buf, 4, DType::f32, world + 3, stream_);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("peer rank " + std::to_string(world + 3)), std::string::npos)
        << e.message();
  }
  stream_.synchronize();  // nothing was submitted, nothing failed
}

TEST_F(MpiCommTest, MpiErrorsBecomeMoepeakErrorsWithMpisText) {
  // A count MPI rejects, raised through MOEPEAK_MPI_CHECK on a communicator with
  // MPI_ERRORS_RETURN.
  int dummy = 0;
  try {
    MOEPEAK_MPI_CHECK(MPI_Send(&dummy, -1, MPI_INT, 0, 0, comm_->native()));
    FAIL() << "MPI accepted a negative count";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("MPI_ERR_COUNT"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("MPI_Send"), std::string::npos) << e.message();
  }
}

TEST_F(MpiCommTest, AnOperationQueuedPastItsCommunicatorIsRefusedNotRunOnAFreedHandle) {
  // An error that unwinds past queued work destroys the communicator before its stream drains
  // (seen as a segfault inside MPI_Irecv that hid an out-of-memory error). The slowed stream has
  // not started the all_reduce when its communicator goes; the task must fail with an Error at
  // synchronize, not call MPI on the freed handle.
  std::unique_ptr<Comm> comm = comm_->duplicate();
  CpuStream slowed("slowed");
  slowed.set_debug_delay(std::chrono::milliseconds(200));
  std::vector<float> data(16, 1.0f), out(16, 0.0f);
  comm->all_reduce(data.data(), out.data(), data.size(), DType::f32, ReduceOp::sum, slowed);
  comm.reset();
  try {
    slowed.synchronize();
    ADD_FAILURE() << "an operation ran after its communicator was destroyed";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("all_reduce: the communicator was destroyed"), std::string::npos)
        << e.message();
  }
  EXPECT_EQ(out[0], 0.0f);  // never reduced
}

TEST_F(MpiCommTest, MismatchedCountsSurfaceAtSynchronize) {
  // Rank 0 sends 8 elements to rank 1, which expects 4 (MPI truncates: MPI_ERR_TRUNCATE), then
  // 4 elements where rank 1 expects 8 (moepeak's own received-count check). Fresh communicator
  // and streams, since a failed stream stays failed.
  std::unique_ptr<Comm> comm = comm_->duplicate();
  const int me = comm->rank();
  std::vector<float> data(8, 1.0f), out(8, 0.0f);
  if (me == 0) {
    CpuStream stream("sender");
    comm->send(data.data(), 8, DType::f32, 1, stream);
    comm->send(data.data(), 4, DType::f32, 1, stream);
    EXPECT_NO_THROW(stream.synchronize());
  } else if (me == 1) {
    CpuStream truncated("truncated");
    comm->recv(out.data(), 4, DType::f32, 0, truncated);
    try {
      truncated.synchronize();
      ADD_FAILURE() << "a truncated receive did not fail";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("MPI_ERR_TRUNCATE"), std::string::npos) << e.message();
    }
    CpuStream short_message("short");
    comm->recv(out.data(), 8, DType::f32, 0, short_message);
    try {
      short_message.synchronize();
      ADD_FAILURE() << "a short message did not fail";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("received 4 elements from rank 0 where 8 were expected"),
                std::string::npos)
          << e.message();
    }
  }
  comm->barrier();
}

}  // namespace
}  // namespace moepeak
