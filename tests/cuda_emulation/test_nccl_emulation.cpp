// The emulated NCCL (include/nccl.h, nccl.cpp) against values every rank computes itself: each
// collective in each dtype and op, in place and out of place, grouped send/recv with uneven and
// zero counts, communicators over sub-groups formed at different times, a one-rank
// communicator, and the errors (bad peer, bad dtype, host memory, a truncated receive).
//
//     OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np 4 test_nccl_emulation
//
// Needs 4 ranks for the sub-group test (other counts skip it). Rank 0 prints GoogleTest's report;
// the others print only their failures, prefixed "[rank r]"; the exit code is the worst rank's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int g_rank = 0;
int g_size = 1;
ncclComm_t g_world = nullptr;  // over MPI_COMM_WORLD, made in main()
cudaStream_t g_stream = nullptr;

// ---- values ---------------------------------------------------------------------------------

struct Bf16 {
  uint16_t bits;
};

uint16_t to_bf16_bits(float f) {  // exact for the small integers used here
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
T make(int v) {
  return static_cast<T>(v);
}
template <>
Bf16 make<Bf16>(int v) {
  return Bf16{to_bf16_bits(static_cast<float>(v))};
}

template <typename T>
double value_of(T x) {
  return static_cast<double>(x);
}
template <>
double value_of<Bf16>(Bf16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rank r's element i: small integers of both signs, exact in every dtype, sums included.
int input(int r, size_t i) { return static_cast<int>((r * 7 + i * 3) % 11) - 5; }

int reduce(ncclRedOp_t op, int a, int b) {
  switch (op) {
    case ncclMax:
      return a > b ? a : b;
    case ncclMin:
      return a < b ? a : b;
    default:
      return a + b;
  }
}
int reduced(ncclRedOp_t op, size_t i) {
  int acc = input(0, i);
  for (int r = 1; r < g_size; ++r) acc = reduce(op, acc, input(r, i));
  return acc;
}

// ---- device memory --------------------------------------------------------------------------

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, sizeof(T) * (n ? n : 1)), cudaSuccess);
    ptr_ = static_cast<T*>(p);
    std::vector<T> poison(n, make<T>(99));
    if (n) upload(poison);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  void upload(const std::vector<T>& v, size_t at = 0) {
    ASSERT_LE(at + v.size(), n_);
    ASSERT_EQ(cudaMemcpy(ptr_ + at, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() {
    EXPECT_EQ(cudaStreamSynchronize(g_stream), cudaSuccess);
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, sizeof(T) * n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

template <typename T>
std::vector<T> inputs(int r, size_t n, size_t first = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = make<T>(input(r, first + i));
  return v;
}

// A communicator over `over` (MPI_COMM_WORLD or a sub-communicator), bootstrapped like
// core/comm/nccl_comm.cpp: rank 0 makes the id and broadcasts it.
ncclComm_t make_comm(MPI_Comm over) {
  int rank = 0, size = 0;
  MPI_Comm_rank(over, &rank);
  MPI_Comm_size(over, &size);
  ncclUniqueId id;
  if (rank == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, over);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, size, id, rank), ncclSuccess) << ncclGetLastError(nullptr);
  return comm;
}

// ---- collectives ----------------------------------------------------------------------------

template <typename T>
void check_all_reduce(ncclDataType_t type, ncclRedOp_t op, bool in_place, size_t n) {
  SCOPED_TRACE("type " + std::to_string(type) + " op " + std::to_string(op) +
               (in_place ? " in place" : " out of place") + " n " + std::to_string(n));
  DeviceBuffer<T> send(n), separate(n);
  send.upload(inputs<T>(g_rank, n));
  DeviceBuffer<T>& recv = in_place ? send : separate;
  ASSERT_EQ(ncclAllReduce(send.get(), recv.get(), n, type, op, g_world, g_stream), ncclSuccess);
  const std::vector<T> got = recv.download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(value_of(got[i]), reduced(op, i)) << "element " << i;
}

template <typename T>
void check_all_reduce_every_op(ncclDataType_t type) {
  for (ncclRedOp_t op : {ncclSum, ncclMax, ncclMin}) {
    for (bool in_place : {false, true}) {
      check_all_reduce<T>(type, op, in_place, 5);
      check_all_reduce<T>(type, op, in_place, 3001);  // past MPI's eager limit
    }
  }
}

TEST(NcclEmulation, AllReduceF32) { check_all_reduce_every_op<float>(ncclFloat32); }
TEST(NcclEmulation, AllReduceFloatAlias) { check_all_reduce<float>(ncclFloat, ncclSum, false, 9); }
TEST(NcclEmulation, AllReduceF64) { check_all_reduce_every_op<double>(ncclFloat64); }
TEST(NcclEmulation, AllReduceBf16) { check_all_reduce_every_op<Bf16>(ncclBfloat16); }
TEST(NcclEmulation, AllReduceI32) { check_all_reduce_every_op<int32_t>(ncclInt32); }
TEST(NcclEmulation, AllReduceIntAlias) { check_all_reduce<int32_t>(ncclInt, ncclMax, true, 9); }
TEST(NcclEmulation, AllReduceI64) { check_all_reduce_every_op<int64_t>(ncclInt64); }

template <typename T>
void check_all_gather(ncclDataType_t type, bool in_place, size_t n) {
  SCOPED_TRACE(std::string(in_place ? "in place" : "out of place") + " n " + std::to_string(n));
  DeviceBuffer<T> recv(n * g_size), separate(n);
  T* send = in_place ? recv.get() + g_rank * n : separate.get();
  if (in_place) {
    recv.upload(inputs<T>(g_rank, n), g_rank * n);
  } else {
    separate.upload(inputs<T>(g_rank, n));
  }
  ASSERT_EQ(ncclAllGather(send, recv.get(), n, type, g_world, g_stream), ncclSuccess);
  const std::vector<T> got = recv.download();
  for (int r = 0; r < g_size; ++r) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(value_of(got[r * n + i]), input(r, i)) << "block " << r << " element " << i;
    }
  }
}

TEST(NcclEmulation, AllGather) {
  for (bool in_place : {false, true}) {
    check_all_gather<float>(ncclFloat32, in_place, 7);
    check_all_gather<Bf16>(ncclBfloat16, in_place, 2500);
    check_all_gather<int64_t>(ncclInt64, in_place, 1);
  }
}

template <typename T>
void check_reduce_scatter(ncclDataType_t type, ncclRedOp_t op, bool in_place, size_t n) {
  SCOPED_TRACE(std::string(in_place ? "in place" : "out of place") + " op " + std::to_string(op) +
               " n " + std::to_string(n));
  DeviceBuffer<T> send(n * g_size), separate(n);
  send.upload(inputs<T>(g_rank, n * g_size));
  T* recv = in_place ? send.get() + g_rank * n : separate.get();
  ASSERT_EQ(ncclReduceScatter(send.get(), recv, n, type, op, g_world, g_stream), ncclSuccess);
  const std::vector<T> all = send.download(), own = separate.download();
  for (size_t i = 0; i < n; ++i) {
    const T got = in_place ? all[g_rank * n + i] : own[i];
    ASSERT_EQ(value_of(got), reduced(op, g_rank * n + i)) << "element " << i;
  }
}

TEST(NcclEmulation, ReduceScatter) {
  for (bool in_place : {false, true}) {
    check_reduce_scatter<float>(ncclFloat32, ncclSum, in_place, 6);
    check_reduce_scatter<double>(ncclFloat64, ncclMin, in_place, 1500);
    check_reduce_scatter<Bf16>(ncclBfloat16, ncclSum, in_place, 2100);
    check_reduce_scatter<int32_t>(ncclInt32, ncclMax, in_place, 3);
  }
}

TEST(NcclEmulation, BroadcastFromNonZeroRoot) {
  const int root = g_size > 2 ? 2 : g_size - 1;
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    const size_t n = 4001;
    DeviceBuffer<int64_t> buf(n), source(n);
    (in_place ? buf : source).upload(inputs<int64_t>(g_rank, n));
    const int64_t* send = in_place ? buf.get() : source.get();
    ASSERT_EQ(ncclBroadcast(send, buf.get(), n, ncclInt64, root, g_world, g_stream), ncclSuccess);
    const std::vector<int64_t> got = buf.download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], input(root, i)) << "element " << i;
  }
}

// ---- grouped send/recv ----------------------------------------------------------------------

size_t a2a_count(int src, int dst) { return static_cast<size_t>((src + 2 * dst) % 4) * 1100; }
int32_t a2a_value(int src, int dst, size_t i) {
  return src * 1000000 + dst * 100000 + static_cast<int32_t>(i);
}

TEST(NcclEmulation, GroupedAllToAllWithUnevenAndZeroCounts) {
  std::vector<size_t> send_at(g_size + 1, 0), recv_at(g_size + 1, 0);
  for (int p = 0; p < g_size; ++p) {
    send_at[p + 1] = send_at[p] + a2a_count(g_rank, p);
    recv_at[p + 1] = recv_at[p] + a2a_count(p, g_rank);
  }
  DeviceBuffer<int32_t> send(send_at[g_size]), recv(recv_at[g_size]);
  std::vector<int32_t> host(send_at[g_size]);
  for (int p = 0; p < g_size; ++p) {
    for (size_t i = 0; i < a2a_count(g_rank, p); ++i)
      host[send_at[p] + i] = a2a_value(g_rank, p, i);
  }
  send.upload(host);
  // Nested groups, every peer including this rank itself, zero counts issued like any other.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int p = 0; p < g_size; ++p) {
    ASSERT_EQ(
        ncclSend(send.get() + send_at[p], a2a_count(g_rank, p), ncclInt32, p, g_world, g_stream),
        ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int p = g_size - 1; p >= 0; --p) {  // receives posted in the other order
    ASSERT_EQ(
        ncclRecv(recv.get() + recv_at[p], a2a_count(p, g_rank), ncclInt32, p, g_world, g_stream),
        ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const std::vector<int32_t> got = recv.download();
  for (int p = 0; p < g_size; ++p) {
    for (size_t i = 0; i < a2a_count(p, g_rank); ++i) {
      ASSERT_EQ(got[recv_at[p] + i], a2a_value(p, g_rank, i)) << "from " << p << " element " << i;
    }
  }
}

TEST(NcclEmulation, RingSendRecvInOrder) {
  // Two messages to the same peer in one group arrive in the order they were sent.
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  DeviceBuffer<float> out(2000), in(2000);
  out.upload(inputs<float>(g_rank, 2000));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(out.get(), 1000, ncclFloat32, next, g_world, g_stream), ncclSuccess);
  ASSERT_EQ(ncclSend(out.get() + 1000, 1000, ncclFloat32, next, g_world, g_stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(in.get(), 1000, ncclFloat32, prev, g_world, g_stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(in.get() + 1000, 1000, ncclFloat32, prev, g_world, g_stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const std::vector<float> got = in.download();
  for (size_t i = 0; i < 2000; ++i) ASSERT_EQ(got[i], input(prev, i)) << "element " << i;
}

// ---- communicators --------------------------------------------------------------------------

// {0,2} and {1,3}: the second forms only after the first has run an all-reduce, so a rendezvous
// that needed every world rank would hang here.
TEST(NcclEmulation, SubGroupCommunicatorsFormedAtDifferentTimes) {
  if (g_size != 4) GTEST_SKIP() << "needs 4 ranks";
  const int color = g_rank % 2;
  MPI_Comm sub = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &sub), MPI_SUCCESS);
  auto sum_of_world_ranks = [&](ncclComm_t comm) {
    DeviceBuffer<int32_t> buf(3);
    buf.upload({g_rank + 1, 10 * (g_rank + 1), -(g_rank + 1)});
    EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 3, ncclInt32, ncclSum, comm, g_stream),
              ncclSuccess);
    return buf.download();
  };
  ncclComm_t comm = nullptr;
  if (color == 0) {
    comm = make_comm(sub);
    EXPECT_EQ(sum_of_world_ranks(comm), (std::vector<int32_t>{4, 40, -4}));
    ASSERT_EQ(MPI_Send(nullptr, 0, MPI_INT, g_rank + 1, 7, MPI_COMM_WORLD), MPI_SUCCESS);
  } else {
    ASSERT_EQ(MPI_Recv(nullptr, 0, MPI_INT, g_rank - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
              MPI_SUCCESS);
    comm = make_comm(sub);
    EXPECT_EQ(sum_of_world_ranks(comm), (std::vector<int32_t>{6, 60, -6}));
  }
  // The world communicator is unaffected, and the sub-group one still works after it.
  check_all_reduce<int32_t>(ncclInt32, ncclSum, false, 11);
  EXPECT_EQ(sum_of_world_ranks(comm)[0], color == 0 ? 4 : 6);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  MPI_Comm_free(&sub);
}

TEST(NcclEmulation, OneRankCommunicatorCopiesLocally) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t one = nullptr;
  ASSERT_EQ(ncclCommInitRank(&one, 1, id, 0), ncclSuccess);
  DeviceBuffer<float> a(8), b(8), c(8);
  a.upload(inputs<float>(g_rank, 8));
  ASSERT_EQ(ncclAllReduce(a.get(), b.get(), 8, ncclFloat32, ncclMax, one, g_stream), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(b.get(), 8, ncclFloat32, 0, one, g_stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(c.get(), 8, ncclFloat32, 0, one, g_stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const std::vector<float> got = c.download();
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(got[i], input(g_rank, i));
  EXPECT_EQ(ncclCommDestroy(one), ncclSuccess);
}

TEST(NcclEmulation, DestroyWithWorkStillQueued) {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD);
  DeviceBuffer<double> buf(5);
  buf.upload(inputs<double>(g_rank, 5));
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), 5, ncclFloat64, ncclSum, comm, g_stream),
            ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);  // before the stream has run the all-reduce
  const std::vector<double> got = buf.download();
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], reduced(ncclSum, i));
}

// ---- errors ---------------------------------------------------------------------------------

TEST(NcclEmulation, BadPeerIsInvalidArgument) {
  DeviceBuffer<float> buf(4);
  EXPECT_EQ(ncclSend(buf.get(), 4, ncclFloat32, g_size, g_world, g_stream), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("peer"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclRecv(buf.get(), 4, ncclFloat32, -1, g_world, g_stream), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buf.get(), buf.get(), 4, ncclFloat32, g_size, g_world, g_stream),
            ncclInvalidArgument);
  // Inside a group the failing call fails the whole group, which queues nothing.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(buf.get(), 4, ncclFloat32, (g_rank + 1) % g_size, g_world, g_stream),
            ncclSuccess);
  EXPECT_EQ(ncclSend(buf.get(), 4, ncclFloat32, g_size + 3, g_world, g_stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);             // no group open
  check_all_reduce<float>(ncclFloat32, ncclSum, true, 4);  // the communicator is still in order
}

TEST(NcclEmulation, BadDtypeAndOpAreInvalidArgument) {
  DeviceBuffer<float> buf(4);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 4, static_cast<ncclDataType_t>(ncclNumTypes + 2),
                          ncclSum, g_world, g_stream),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("datatype"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclAllGather(buf.get(), buf.get(), 1, ncclFloat16, g_world, g_stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 4, ncclFloat32, static_cast<ncclRedOp_t>(9),
                          g_world, g_stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 4, ncclFloat32, ncclAvg, g_world, g_stream),
            ncclInvalidArgument);
}

TEST(NcclEmulation, NullCommHostMemoryAndBadInitAreErrors) {
  DeviceBuffer<float> buf(4);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 4, ncclFloat32, ncclSum, nullptr, g_stream),
            ncclInvalidArgument);
  std::vector<float> host(4);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, g_world, g_stream),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("device memory"), std::string::npos);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  ncclUniqueId zero{};
  EXPECT_EQ(ncclCommInitRank(&comm, 2, zero, 0), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

TEST(NcclEmulation, TruncatedReceiveIsAnAsyncError) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  ncclComm_t comm = make_comm(MPI_COMM_WORLD);
  DeviceBuffer<float> buf(100);
  if (g_rank == 0) {
    ASSERT_EQ(ncclSend(buf.get(), 100, ncclFloat32, 1, comm, g_stream), ncclSuccess);
  } else if (g_rank == 1) {
    ASSERT_EQ(ncclRecv(buf.get(), 50, ncclFloat32, 0, comm, g_stream), ncclSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(g_stream), cudaSuccess);
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  if (g_rank == 1) {
    EXPECT_EQ(async, ncclSystemError);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("ncclRecv"), std::string::npos)
        << ncclGetLastError(comm);
    EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 1, ncclFloat32, ncclSum, comm, g_stream),
              ncclSystemError);  // a failed communicator takes no more work
  } else {
    EXPECT_EQ(async, ncclSuccess);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclEmulation, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(version, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("invalid argument"),
            std::string::npos);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
}

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

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 2;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_rank != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(g_rank));
  }
  int result = 2;
  if (cudaStreamCreate(&g_stream) == cudaSuccess) {
    g_world = make_comm(MPI_COMM_WORLD);
    result = RUN_ALL_TESTS();
    ncclCommDestroy(g_world);
    cudaStreamDestroy(g_stream);
  }
  int worst = result;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
