// The emulated CUDA runtime (runtime.cpp) against the semantics its NOTES promise: lazy streams
// that run only when something waits for them, event waits between streams, the legacy default
// stream's implicit synchronisation, pageable versus pinned copies, events, launch checks,
// shared memory, device memory accounting and atomics. The faults (the sticky
// cudaErrorLaunchFailure) are in test_runtime_emulation_fault.cpp: they end a process's CUDA.
//
// Kernels are plain C++ written with device_prelude.h and launched with launcher(), exactly what
// rewrite_cu makes of a .cu file. "Device" memory is this process's memory, so the tests read and
// write it directly to see what has run and what has not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <mma.h>  // the WMMA emulation, tests/cuda_emulation/include

#include "tests/cuda_emulation/device_prelude.h"

namespace {

using moepeak::cuda_emulation::launcher;

constexpr size_t kDeviceBytes = size_t{1} << 30;  // main() sets MOEPEAK_CUDA_EMULATION_DEVICE_BYTES
constexpr int kN = 256;

bool poisoned(float v) {  // all four bytes 0xff: what fresh device and shared memory hold
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits == 0xffffffffu;
}

__global__ void fill(float* p, int n, float value) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] = value;
}
__global__ void scale_add(float* p, int n, float a, float b) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] = p[i] * a + b;
}
__global__ void copy(float* dst, const float* src, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) dst[i] = src[i];
}

void launch_fill(cudaStream_t s, float* p, float value) {
  launcher("fill", fill, kN / 64, 64, 0, s)(p, kN, value);
}
void launch_copy(cudaStream_t s, float* dst, const float* src) {
  launcher("copy", copy, kN / 64, 64, 0, s)(dst, src, kN);
}

// Every element of p[0, n) is `value` (written by the host: device memory is host memory here).
void set(float* p, float value, int n = kN) {
  for (int i = 0; i < n; ++i) p[i] = value;
}
::testing::AssertionResult all_equal(const float* p, float value, int n = kN) {
  for (int i = 0; i < n; ++i) {
    if (p[i] != value) return ::testing::AssertionFailure() << "p[" << i << "] = " << p[i];
  }
  return ::testing::AssertionSuccess();
}

// Each test leaves nothing queued and no error behind.
class Runtime : public ::testing::Test {
 protected:
  float* device(int n = kN) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
    buffers_.push_back(p);
    return static_cast<float*>(p);
  }
  cudaStream_t stream(unsigned flags) {
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    streams_.push_back(s);
    return s;
  }
  void TearDown() override {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (cudaStream_t s : streams_) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    for (void* p : buffers_) EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

 private:
  std::vector<void*> buffers_;
  std::vector<cudaStream_t> streams_;
};
using StreamOrder = Runtime;
using Copies = Runtime;
using Events = Runtime;
using Launch = Runtime;
using SharedMemory = Runtime;
using DeviceMemory = Runtime;
using Atomics = Runtime;

TEST_F(StreamOrder, QueuedWorkRunsOnlyAtTheSynchronizeAndThenInOrder) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* p = device();
  launch_fill(s, p, 3.0f);
  launcher("scale_add", scale_add, kN / 64, 64, 0, s)(p, kN, 2.0f, 1.0f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(poisoned(p[0]) && poisoned(p[kN - 1])) << "ran before anything waited for it";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(p, 7.0f));  // fill, then scale_add: 3 * 2 + 1
}

TEST_F(StreamOrder, ConsumerThatWaitsForTheProducersEventSeesItsResult) {
  cudaStream_t producer = stream(cudaStreamNonBlocking), consumer = stream(cudaStreamNonBlocking);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  launch_fill(producer, buf, 2.0f);
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, ready, 0), cudaSuccess);
  launch_copy(consumer, out, buf);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 2.0f));
  EXPECT_EQ(cudaEventDestroy(ready), cudaSuccess);
}

TEST_F(StreamOrder, ConsumerWithoutTheWaitSeesTheOldContents) {
  cudaStream_t producer = stream(cudaStreamNonBlocking), consumer = stream(cudaStreamNonBlocking);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  launch_fill(producer, buf, 2.0f);
  ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
  launch_copy(consumer, out, buf);  // the missing cudaStreamWaitEvent
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 1.0f)) << "the consumer ran after the producer without a wait";
  EXPECT_TRUE(all_equal(buf, 1.0f));
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);
  EXPECT_TRUE(all_equal(buf, 2.0f));
  EXPECT_EQ(cudaEventDestroy(ready), cudaSuccess);
}

TEST_F(StreamOrder, LegacyDefaultStreamWaitsForABlockingStream) {
  cudaStream_t blocking = stream(cudaStreamDefault);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  launch_fill(blocking, buf, 2.0f);
  launch_copy(nullptr, out, buf);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 2.0f));
}

TEST_F(StreamOrder, BlockingStreamWaitsForTheLegacyDefaultStream) {
  cudaStream_t blocking = stream(cudaStreamDefault);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  launch_fill(nullptr, buf, 5.0f);
  launch_copy(blocking, out, buf);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 5.0f));
}

TEST_F(StreamOrder, LegacyDefaultStreamAndANonBlockingStreamDoNotWaitForEachOther) {
  cudaStream_t nonblocking = stream(cudaStreamNonBlocking);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  launch_fill(nonblocking, buf, 2.0f);
  launch_copy(nullptr, out, buf);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 1.0f));
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_TRUE(all_equal(buf, 2.0f));

  launch_fill(nullptr, buf, 5.0f);
  launch_copy(nonblocking, out, buf);
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 2.0f));
}

// DISABLED: runtime.cpp has one legacy default stream for all devices; CUDA has one per device
// (per context), so work on device 1's default stream does not wait for a blocking stream of
// device 0. The emulation over-synchronises here and would hide a missing cross-device wait.
TEST_F(StreamOrder, LegacyDefaultStreamOfAnotherDeviceDoesNotWaitForThisDevicesStream) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t blocking = stream(cudaStreamDefault);
  float *buf = device(), *out = device();
  set(buf, 1.0f);
  launch_fill(blocking, buf, 2.0f);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  launch_copy(nullptr, out, buf);  // peer access: the emulated devices share the address space
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_TRUE(all_equal(out, 1.0f));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(Copies, PageableCopyCompletesBeforeItReturns) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device();
  std::vector<float> host(kN, 3.0f);
  launch_fill(s, dev, 7.0f);  // earlier work on the stream runs first
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 3.0f));
  set(host.data(), 4.0f);  // the source may be reused at once
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 3.0f));

  launch_fill(s, dev, 5.0f);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), dev, kN * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_TRUE(all_equal(host.data(), 5.0f));
}

TEST_F(Copies, CopyFromMallocHostMemoryReadsItWhenTheStreamRuns) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device();
  set(dev, 1.0f);
  void* raw = nullptr;
  ASSERT_EQ(cudaMallocHost(&raw, kN * sizeof(float)), cudaSuccess);
  auto* pinned = static_cast<float*>(raw);
  set(pinned, 3.0f);
  ASSERT_EQ(cudaMemcpyAsync(dev, pinned, kN * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 1.0f));
  set(pinned, 4.0f);  // a race on a GPU: the emulation reads it as late as CUDA allows
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 4.0f));

  launch_fill(s, dev, 6.0f);
  ASSERT_EQ(cudaMemcpyAsync(pinned, dev, kN * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_TRUE(all_equal(pinned, 4.0f));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(pinned, 6.0f));
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

TEST_F(Copies, CopyFromRegisteredMemoryReadsItWhenTheStreamRuns) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device();
  set(dev, 1.0f);
  std::vector<float> host(kN, 3.0f);
  ASSERT_EQ(cudaHostRegister(host.data(), kN * sizeof(float), cudaHostRegisterDefault),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 1.0f));
  set(host.data(), 4.0f);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 4.0f));
  EXPECT_EQ(cudaHostUnregister(host.data()), cudaSuccess);
}

TEST_F(Copies, CopyRunningPastTheEndOfAnAllocationIsInvalidValue) {
  float* dev = device(64);
  set(dev, 1.0f, 64);
  std::vector<float> host(65, 2.0f);
  EXPECT_EQ(cudaMemcpy(dev + 32, host.data(), 33 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // reading the error clears it
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 65 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(dev + 1, 0, 64 * sizeof(float), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 1.0f, 64)) << "a rejected copy wrote";
  EXPECT_EQ(cudaMemcpy(dev + 32, host.data(), 32 * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);  // up to the last byte is fine
}

// DISABLED: a copy that starts at or after the end of an allocation is not in any cudaMalloc'd
// range, so runtime.cpp takes it for pageable host memory (the cudaMemcpyKind is ignored) and
// copies: this one writes into the slack of the allocation's page and returns cudaSuccess.
TEST_F(Copies, HostToDeviceCopyStartingAtTheEndOfAnAllocationIsInvalidValue) {
  float* dev = device(64);
  const float value = 2.0f;
  EXPECT_EQ(cudaMemcpy(dev + 64, &value, sizeof value, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(Events, QueryIsNotReadyAtFirstThenCompletes) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device();
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);  // never recorded: nothing to wait for
  launch_fill(s, dev, 2.0f);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_TRUE(poisoned(dev[0]));
  cudaError_t status = cudaErrorNotReady;
  for (int tries = 0; tries < 100 && status == cudaErrorNotReady; ++tries) {
    status = cudaEventQuery(e);
  }
  EXPECT_EQ(status, cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 2.0f));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cudaErrorNotReady is not an error
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(Events, EventSynchronizeRunsTheStreamUpToTheRecordOnly) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float *before = device(), *after = device();
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  launch_fill(s, before, 2.0f);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  launch_fill(s, after, 3.0f);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_TRUE(all_equal(before, 2.0f));
  EXPECT_TRUE(poisoned(after[0]));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(after, 3.0f));
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(Events, ElapsedTimeNeedsTimingEvents) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  cudaEvent_t start, end, untimed_start, untimed_end;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed_start, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed_end, cudaEventDisableTiming), cudaSuccess);
  for (cudaEvent_t e : {start, untimed_start}) ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  launch_fill(s, device(), 1.0f);
  for (cudaEvent_t e : {end, untimed_end}) ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, untimed_start, untimed_end), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed_end), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  for (cudaEvent_t e : {start, end, untimed_start, untimed_end}) {
    EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  }
}

TEST_F(Events, WaitingForANeverRecordedEventIsANoOp) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device();
  cudaEvent_t never;
  ASSERT_EQ(cudaEventCreate(&never), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, never, 0), cudaSuccess);
  launch_fill(s, dev, 2.0f);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 2.0f));
  EXPECT_EQ(cudaEventDestroy(never), cudaSuccess);
}

TEST_F(Launch, MoreThan1024ThreadsPerBlockIsInvalidConfigurationAndNothingRuns) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* dev = device(2048);
  for (dim3 block : {dim3(1025), dim3(32, 32, 2), dim3(1, 1, 65)}) {
    launcher("fill", fill, 1, block, 0, s)(dev, 2048, 2.0f);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  launcher("fill", fill, 0, 64, 0, s)(dev, 2048, 2.0f);  // an empty grid
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(poisoned(dev[0]));
  launcher("fill", fill, 2, 1024, 0, s)(dev, 2048, 2.0f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(dev, 2.0f, 2048));
}

// Thread 0 writes the last byte of the block's dynamic shared memory and copies it out.
__global__ void last_shared_byte(float* out, int bytes) {
  auto* smem = static_cast<unsigned char*>(moepeak::cuda_emulation::dynamic_shared());
  if (threadIdx.x == 0) {
    smem[bytes - 1] = 7;
    out[0] = smem[bytes - 1];
  }
}
__global__ void last_shared_byte_opted_in(float* out, int bytes) {  // its own attribute
  auto* smem = static_cast<unsigned char*>(moepeak::cuda_emulation::dynamic_shared());
  if (threadIdx.x == 0) {
    smem[bytes - 1] = 9;
    out[0] = smem[bytes - 1];
  }
}

TEST_F(Launch, DynamicSharedMemoryOver48KiBFailsWithoutTheAttribute) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* out = device(1);
  const int over = 48 * 1024 + 1;
  launcher("last_shared_byte", last_shared_byte, 1, 32, over, s)(out, over);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(poisoned(out[0]));
  launcher("last_shared_byte", last_shared_byte, 1, 32, 48 * 1024, s)(out, 48 * 1024);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(out[0], 7.0f);
}

TEST_F(Launch, MaxDynamicSharedMemorySizeAttributeRaisesTheLimitOfThatKernel) {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  float* out = device(1);
  const int bytes = 200 * 1024;
  EXPECT_EQ(cudaFuncSetAttribute(last_shared_byte_opted_in,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 1),
            cudaErrorInvalidValue);  // over sm_90's opt-in limit
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(last_shared_byte_opted_in,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
            cudaSuccess);
  launcher("last_shared_byte_opted_in", last_shared_byte_opted_in, 1, 32, bytes, s)(out, bytes);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  launcher("last_shared_byte_opted_in", last_shared_byte_opted_in, 1, 32, bytes + 1, s)(out, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  launcher("last_shared_byte", last_shared_byte, 1, 32, bytes, s)(out, bytes);  // no attribute
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(out[0], 9.0f);
}

// One 16x16x16 WMMA product of all-ones tiles by a warp whose block opted into all 227 KiB of
// dynamic shared memory and writes its last byte: the emulation's operand exchange
// (include/mma.h) takes none of the kernel's shared memory, as on the hardware.
__global__ void wmma_with_all_shared_memory(float* out, int bytes) {
  namespace wmma = nvcuda::wmma;
  auto* smem = static_cast<unsigned char*>(moepeak::cuda_emulation::dynamic_shared());
  auto* ones = reinterpret_cast<__nv_bfloat16*>(smem);  // 16 x 16
  for (int i = static_cast<int>(threadIdx.x); i < 256; i += 32) ones[i] = __float2bfloat16(1.0f);
  if (threadIdx.x == 0) smem[bytes - 1] = 3;
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::load_matrix_sync(a, ones, 16);
  wmma::load_matrix_sync(b, ones, 16);
  wmma::fill_fragment(c, 0.0f);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
  if (threadIdx.x == 0) out[256] = smem[bytes - 1];
}

TEST_F(SharedMemory, WmmaLeavesTheKernelAllItsSharedMemory) {
  const int bytes = 227 * 1024;
  float* out = device(257);
  ASSERT_EQ(cudaFuncSetAttribute(wmma_with_all_shared_memory,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
            cudaSuccess);
  launcher("wmma_with_all_shared_memory", wmma_with_all_shared_memory, 1, 32, bytes, nullptr)(
      out, bytes);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(out[i], 16.0f) << i;
  EXPECT_EQ(out[256], 3.0f);
}

// Thread t counts whether its slot was fresh, writes it, and after the barrier reads its
// mirror's slot: one array per block, shared by the block's threads.
__global__ void static_shared_mirror(float* out, int* fresh) {
  static const char site = 0;
  auto& tile = moepeak::cuda_emulation::static_shared<float[64]>(&site);
  const unsigned t = threadIdx.x, b = blockIdx.x;
  if (poisoned(tile[t])) atomicAdd(fresh, 1);
  tile[t] = static_cast<float>(100 * b + t);
  __syncthreads();
  out[64 * b + t] = tile[63 - t];
}
__global__ void dynamic_shared_fresh(int* fresh) {
  auto* smem = static_cast<float*>(moepeak::cuda_emulation::dynamic_shared());
  if (poisoned(smem[threadIdx.x]) && std::isnan(smem[threadIdx.x])) atomicAdd(fresh, 1);
  smem[threadIdx.x] = 1.0f;
}

TEST_F(SharedMemory, StaticSharedIsOneArrayPerBlockAndFreshAtEveryBlock) {
  float* out = device(3 * 64);
  int* fresh = reinterpret_cast<int*>(device(1));
  *fresh = 0;
  launcher("static_shared_mirror", static_shared_mirror, 3, 64, 0, nullptr)(out, fresh);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(*fresh, 3 * 64);
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 64; ++t) ASSERT_EQ(out[64 * b + t], 100 * b + 63 - t) << b << " " << t;
  }
}

TEST_F(SharedMemory, DynamicSharedStartsAsNaNAtEveryBlock) {
  int* fresh = reinterpret_cast<int*>(device(1));
  *fresh = 0;
  launcher("dynamic_shared_fresh", dynamic_shared_fresh, 3, 64, 64 * sizeof(float), nullptr)(fresh);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(*fresh, 3 * 64);
}

TEST_F(DeviceMemory, SmallAllocationsStartAsNaNBytes) {
  const float* dev = device(1000);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(poisoned(dev[i])) << i;
}

TEST_F(DeviceMemory, MemGetInfoFallsByAnAllocationAndRisesAfterFree) {
  size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  EXPECT_EQ(total, kDeviceBytes);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0 - (3 << 20));
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
  EXPECT_EQ(free2, free0);
}

TEST_F(DeviceMemory, AllocationPastTheDeviceCapacityIsMemoryAllocation) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(cudaMalloc(&p, free_bytes + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&p, free_bytes), cudaSuccess);  // all of it (mapped lazily)
  void* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&more, 1), cudaSuccess);
  EXPECT_EQ(cudaFree(more), cudaSuccess);
}

__global__ void accumulate(float* sums, int* count) {
  atomicAdd(&sums[0], 1.0f);
  atomicAdd(&sums[1], static_cast<float>(threadIdx.x % 4));
  atomicAdd(count, 1);
}

TEST_F(Atomics, FloatAtomicAddFromManyThreadsAndBlocksSumsExactly) {
  float* sums = device(2);
  int* count = reinterpret_cast<int*>(device(1));
  set(sums, 0.0f, 2);
  *count = 0;
  launcher("accumulate", accumulate, 8, 256, 0, nullptr)(sums, count);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(sums[0], 8 * 256);
  EXPECT_EQ(sums[1], 8 * 64 * (0 + 1 + 2 + 3));
  EXPECT_EQ(*count, 8 * 256);
}

}  // namespace

int main(int argc, char** argv) {
  // Before the first CUDA call: the emulation reads it once.
  setenv("MOEPEAK_CUDA_EMULATION_DEVICE_BYTES", std::to_string(kDeviceBytes).c_str(), 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
