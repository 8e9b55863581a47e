// Faults in the emulated CUDA runtime (runtime.cpp): a kernel that breaks a barrier fails the
// call that makes it run with cudaErrorLaunchFailure, prints what failed to stderr, and every
// later call returns that error, as after a device fault on a GPU.
//
// The sticky error is the process's for good, so each test needs a process of its own: ctest
// runs this program once per test (--gtest_filter), and a test that finds an earlier fault in
// its process skips itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda_emulation/device_prelude.h"

namespace {

using moepeak::cuda_emulation::launcher;

bool g_faulted = false;  // a fault test already ran in this process

bool poisoned(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits == 0xffffffffu;
}

__global__ void fill(float* p, int n, float value) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] = value;
}

// Half the warp waits at __syncthreads, the other half at a shuffle that needs the whole warp.
__global__ void barrier_in_divergent_code(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

// Lane 0 exits while the other lanes wait for it at a full-warp shuffle.
__global__ void lane_exits_before_the_shuffle(float* out) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<float>(threadIdx.x), 1);
}

float* device_floats(int n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  return static_cast<float*>(p);
}

// After the fault: every call that checks returns cudaErrorLaunchFailure, reading it does not
// clear it, and nothing queued or launched runs any more. `other` is a non-blocking stream
// with a fill of `untouched` queued on it before the fault.
void expect_sticky(cudaStream_t other, const float* untouched) {
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorLaunchFailure);
  EXPECT_TRUE(poisoned(untouched[0])) << "work queued before the fault ran after it";
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreate(&s), cudaErrorLaunchFailure);
  std::vector<float> host(32, 5.0f);
  EXPECT_EQ(cudaMemcpy(host.data(), untouched, 32 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaErrorLaunchFailure);
  EXPECT_EQ(host[0], 5.0f);
  float* dev = const_cast<float*>(untouched);
  launcher("fill", fill, 1, 32, 0, nullptr)(dev, 32, 2.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_TRUE(poisoned(untouched[0])) << "a launch after the fault ran";
}

TEST(Fault, BarrierInDivergentCodeFailsTheStreamSynchronizeAndStaysSticky) {
  if (g_faulted) GTEST_SKIP() << "an earlier fault in this process: run each test alone";
  g_faulted = true;
  float *out = device_floats(32), *untouched = device_floats(32);
  cudaStream_t faulting = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&faulting, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  launcher("fill", fill, 1, 32, 0, other)(untouched, 32, 2.0f);
  launcher("barrier_in_divergent_code", barrier_in_divergent_code, 1, 32, 0, faulting)(out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the launch itself is valid
  ::testing::internal::CaptureStderr();
  const cudaError_t status = cudaStreamSynchronize(faulting);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel barrier_in_divergent_code failed"), std::string::npos) << printed;
  EXPECT_NE(printed.find("deadlock"), std::string::npos) << printed;
  expect_sticky(other, untouched);
}

TEST(Fault, LaneExitingWhileTheWarpWaitsAtAShuffleFailsThePageableCopyAndStaysSticky) {
  if (g_faulted) GTEST_SKIP() << "an earlier fault in this process: run each test alone";
  g_faulted = true;
  float *out = device_floats(32), *untouched = device_floats(32);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  launcher("fill", fill, 1, 32, 0, other)(untouched, 32, 2.0f);
  launcher("lane_exits_before_the_shuffle", lane_exits_before_the_shuffle, 1, 32, 0, nullptr)(out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> host(32, 5.0f);
  ::testing::internal::CaptureStderr();
  // A copy to pageable memory runs the legacy default stream up to it: the kernel runs there.
  const cudaError_t status =
      cudaMemcpy(host.data(), out, 32 * sizeof(float), cudaMemcpyDeviceToHost);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel lane_exits_before_the_shuffle failed"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("exited while the lanes"), std::string::npos) << printed;
  EXPECT_EQ(host[0], 5.0f) << "the copy after the failed kernel ran";
  expect_sticky(other, untouched);
}

}  // namespace
