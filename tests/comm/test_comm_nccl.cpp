// NcclComm on device buffers: the same checks as the MPI test (comm_checks.h), with buffers in
// GPU memory and operations on CUDA streams. Skips when no CUDA device is usable.
//
//     ctest -L cuda --output-on-failure                 (one rank)
//     mpirun -np <GPUs per node> build/tests/comm/test_comm_nccl   (one GPU per rank)
//     build/tests/comm/test_comm_nccl                   (a plain process: a world of one, no MPI)
//
// A world of one still goes through NCCL here (NcclComm is built directly; make_comm would give
// the single-rank communicator), so the NCCL calls, types and in-place forms run on one GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "core/comm/nccl_comm.h"
#include "core/comm/process_group.h"
#include "core/comm/single_comm.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/cuda_check.h"
#include "tests/comm/comm_checks.h"

namespace moepeak {
namespace {

using namespace testing_comm;

class CudaTestMemory final : public TestMemory {
 public:
  ~CudaTestMemory() override {
    for (void* p : blocks_) cudaFree(p);
  }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    MOEPEAK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    blocks_.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    MOEPEAK_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    MOEPEAK_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

 private:
  std::vector<void*> blocks_;
};

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Backend::cuda_available()) GTEST_SKIP() << "no usable CUDA device";
    ranks_ = init_process_group();
    int devices = 0;
    MOEPEAK_CUDA_CHECK(cudaGetDeviceCount(&devices));
    BackendOptions options;
    options.kind = BackendKind::cuda;
    options.device_index = ranks_.local_rank % devices;
    options.device_memory = 256ull << 20;
    options.pinned_budget = 16ull << 20;
    backend_ = Backend::create(options);
    MOEPEAK_CUDA_CHECK(cudaSetDevice(options.device_index));
    MPI_Comm bootstrap = process_group_uses_mpi() ? MPI_COMM_WORLD : MPI_COMM_NULL;
    comm_ = std::make_unique<NcclComm>(ranks_, bootstrap, options.device_index);
    stream_ = backend_->create_stream("nccl-test");
  }
  void TearDown() override {
    // Streams and communicator before the backend.
    stream_.reset();
    comm_.reset();
    backend_.reset();
  }

  RankInfo ranks_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<NcclComm> comm_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(NcclCommTest, EveryOperationF32) {
  CudaTestMemory mem;
  check_every_operation<float>(*comm_, *stream_, mem, 100);
}
TEST_F(NcclCommTest, EveryOperationF64) {
  CudaTestMemory mem;
  check_every_operation<double>(*comm_, *stream_, mem, 200);
}
TEST_F(NcclCommTest, EveryOperationBf16) {
  CudaTestMemory mem;
  check_every_operation<bf16>(*comm_, *stream_, mem, 300);
}
TEST_F(NcclCommTest, EveryOperationI32) {
  CudaTestMemory mem;
  check_every_operation<int32_t>(*comm_, *stream_, mem, 400);
}
TEST_F(NcclCommTest, EveryOperationI64) {
  CudaTestMemory mem;
  check_every_operation<int64_t>(*comm_, *stream_, mem, 500);
}

TEST_F(NcclCommTest, SplitGroupsByColorRankedByKey) {
  CudaTestMemory mem;
  check_split(*comm_, *stream_, mem, 2, 1000);
  check_split(*comm_, *stream_, mem, 1, 1001);
}

TEST_F(NcclCommTest, DuplicateAndBarrier) {
  std::unique_ptr<Comm> dup = comm_->duplicate();
  EXPECT_EQ(dup->kind(), "nccl");
  CudaTestMemory mem;
  std::unique_ptr<Stream> other = backend_->create_stream("nccl-dup");
  check_all_reduce<float>(*dup, *other, mem, 17, ReduceOp::sum, false, 7);
  check_all_gather<bf16>(*comm_, *stream_, mem, 5, true, 8);
  comm_->barrier();
  dup->barrier();
}

TEST_F(NcclCommTest, CpuStreamAndBadPeersAreErrors) {
  CudaTestMemory mem;
  void* buf = mem.alloc(64);
  std::unique_ptr<Backend> cpu = Backend::create(BackendOptions{});
  EXPECT_THROW(comm_->all_reduce(buf, buf, 4, DType::f32, ReduceOp::sum, cpu->default_stream()),
               Error);
  EXPECT_THROW(comm_->send(buf, 4, DType::f32, comm_->world_size(), *stream_), Error);
  EXPECT_THROW(comm_->send(buf, 4, DType::f32, comm_->rank(), *stream_), Error);
  EXPECT_THROW(comm_->broadcast(buf, 4, DType::f32, -1, *stream_), Error);
}

TEST_F(NcclCommTest, SingleCommCopiesOnTheCudaStream) {
  RankInfo one;
  SingleComm single(BackendKind::cuda, one);
  CudaTestMemory mem;
  check_every_operation<float>(single, *stream_, mem, 900);
  check_every_operation<bf16>(single, *stream_, mem, 901);
}

}  // namespace
}  // namespace moepeak
