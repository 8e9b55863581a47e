// SingleComm (a world of one) on the CPU: every operation is a stream-ordered copy; send/recv to
// itself and peers other than 0 are errors; a plain process (no launcher) is a world of one
// without MPI, and make_comm gives it the single-rank communicator.
//
//     ctest -R test_comm_single --output-on-failure
#include <gtest/gtest.h>

#include "core/comm/process_group.h"
#include "core/comm/single_comm.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "tests/comm/comm_checks.h"

namespace moepeak {
namespace {

using namespace testing_comm;

TEST(SingleComm, EveryOperationIsACopy) {
  SingleComm comm(BackendKind::cpu);
  CpuStream stream("single");
  HostTestMemory mem;
  EXPECT_EQ(comm.kind(), "single");
  EXPECT_EQ(comm.world_size(), 1);
  check_every_operation<float>(comm, stream, mem, 1);
  check_every_operation<double>(comm, stream, mem, 2);
  check_every_operation<bf16>(comm, stream, mem, 3);
  check_every_operation<int32_t>(comm, stream, mem, 4);
  check_every_operation<int64_t>(comm, stream, mem, 5);
  std::unique_ptr<Comm> dup = comm.duplicate();
  check_every_operation<float>(*dup, stream, mem, 6);
  check_split(comm, stream, mem, 1, 7);  // the one rank is its own group
  EXPECT_THROW(comm.split(-1, 0), Error);
}

TEST(SingleComm, CopiesRunInStreamOrder) {
  // A slowed stream: the copy must not have happened before synchronize says so, and must have
  // happened after.
  SingleComm comm(BackendKind::cpu);
  CpuStream stream("slow");
  stream.set_debug_delay(std::chrono::microseconds(20000));
  std::vector<float> src(64, 3.0f), dst(64, 0.0f);
  comm.all_reduce(src.data(), dst.data(), src.size(), DType::f32, ReduceOp::sum, stream);
  stream.synchronize();
  EXPECT_EQ(dst, src);
}

TEST(SingleComm, SendRecvToItselfAndOtherRanksAreErrors) {
  SingleComm comm(BackendKind::cpu);
  CpuStream stream("single");
  float buf[4] = {};
  EXPECT_THROW(comm.send(buf, 4, DType::f32, 0, stream), Error);
  EXPECT_THROW(comm.recv(buf, 4, DType::f32, 0, stream), Error);
  EXPECT_THROW(comm.send(buf, 4, DType::f32, 1, stream), Error);
  EXPECT_THROW(comm.broadcast(buf, 4, DType::f32, 1, stream), Error);
  EXPECT_THROW(comm.sendrecv(buf, 2, 1, buf + 2, 2, 0, DType::f32, stream), Error);
  EXPECT_THROW(comm.sendrecv(buf, 2, 0, buf + 2, 3, 0, DType::f32, stream), Error);
  EXPECT_THROW(comm.all_reduce(buf, buf + 1, 2, DType::f32, ReduceOp::sum, stream), Error);
  std::vector<size_t> two(2, 0), one(1, 0);
  EXPECT_THROW(comm.all_to_all_v(buf, two, two, buf, two, two, DType::f32, stream), Error);
  std::vector<size_t> send_count{2}, recv_count{3};
  EXPECT_THROW(
      comm.all_to_all_v(buf, send_count, one, buf + 2, recv_count, one, DType::f32, stream), Error);
  RankInfo two_ranks;
  two_ranks.world_size = 2;
  EXPECT_THROW(SingleComm(BackendKind::cpu, two_ranks), Error);
  comm.barrier();
  stream.synchronize();
}

TEST(SingleComm, PlainProcessIsAWorldOfOneWithoutMpi) {
  if (detect_launcher_env(process_env()).launched()) {
    GTEST_SKIP() << "this test runs as a plain process, not under a launcher";
  }
  {
    ProcessGroup group;
    const RankInfo& me = group.ranks();
    EXPECT_EQ(me.rank, 0);
    EXPECT_EQ(me.world_size, 1);
    EXPECT_EQ(me.local_rank, 0);
    EXPECT_EQ(me.local_size, 1);
    EXPECT_FALSE(me.host.empty());
    EXPECT_TRUE(process_group_initialized());
    EXPECT_FALSE(process_group_uses_mpi());
    EXPECT_EQ(local_rank_source(), "single process");
    EXPECT_EQ(process_rank(), 0);
    EXPECT_EQ(init_process_group().world_size, 1);  // idempotent

    std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
    std::unique_ptr<Comm> comm = make_comm(*backend, me);
    EXPECT_EQ(comm->kind(), "single");
    HostTestMemory mem;
    check_all_gather<float>(*comm, backend->default_stream(), mem, 5, false, 9);
  }
  EXPECT_FALSE(process_group_initialized());
  finalize_process_group();  // twice is fine
  // Without MPI a world of one can start again.
  EXPECT_EQ(init_process_group().world_size, 1);
  finalize_process_group();
}

TEST(SingleComm, ReduceOpNames) {
  EXPECT_EQ(reduce_op_name(ReduceOp::sum), "sum");
  EXPECT_EQ(reduce_op_name(ReduceOp::max), "max");
  EXPECT_EQ(reduce_op_name(ReduceOp::min), "min");
}

}  // namespace
}  // namespace moepeak
