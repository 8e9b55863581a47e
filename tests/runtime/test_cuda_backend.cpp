// The CUDA backend on a real GPU: arena and OOM, pinned copies at both ends, cross-stream event
// ordering, and the first ops (fill, convert) bit-equal to the CPU backend. Label `cuda`; every
// test skips when no CUDA device is usable. Run: ctest -L cuda
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/convert.h"
#include "ops/fill.h"

namespace moepeak {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Backend::cuda_available()) GTEST_SKIP() << "no CUDA device";
    BackendOptions opts;
    opts.kind = BackendKind::cuda;
    opts.device_memory = 256ull << 20;
    opts.pinned_budget = 64ull << 20;
    gpu = Backend::create(opts);
    cpu = Backend::create(BackendOptions{});
  }
  std::unique_ptr<Backend> gpu, cpu;
};

TEST_F(CudaBackendTest, ArenaCapacityAndOutOfMemory) {
  EXPECT_EQ(gpu->kind(), BackendKind::cuda);
  EXPECT_EQ(gpu->memory_info().capacity, 256ull << 20);
  auto a = gpu->alloc(200ull << 20, LiveSet::weights, "weights");
  EXPECT_THROW(gpu->alloc(100ull << 20, LiveSet::logits, "logits"), Error);
  EXPECT_EQ(gpu->arena().stats().current()[LiveSet::weights], 200ull << 20);
}

// The driver's view beside the arena's (the metrics' device_used_bytes, outside_arena_bytes):
// the arena is one cudaMalloc the driver counts as used, taken after what was in use at open.
TEST_F(CudaBackendTest, TheDriverSeesTheArenaBesideWhatWasUsedAtOpen) {
  const MemoryInfo info = gpu->memory_info();
  ASSERT_GT(info.physical_total, 0u);
  const uint64_t used = info.physical_total - info.physical_free;
  EXPECT_GE(used, info.capacity + info.used_before_arena);
  EXPECT_LT(info.used_before_arena, info.physical_total);
  // Sub-allocation is the arena's own: the driver's count does not move.
  auto a = gpu->alloc(64ull << 20, LiveSet::weights, "weights");
  EXPECT_EQ(gpu->memory_info().physical_free, info.physical_free);
}

TEST_F(CudaBackendTest, PinnedRoundTripAcrossStreamsOrderedByEvents) {
  constexpr size_t n = 1 << 20;
  auto host_in = gpu->pinned().alloc(n * 4, LiveSet::boundaries, "in");
  auto host_out = gpu->pinned().alloc(n * 4, LiveSet::boundaries, "out");
  auto dev = gpu->alloc(n * 4, LiveSet::boundaries, "dev");
  for (size_t i = 0; i < n; ++i) host_in.as<uint32_t>()[i] = static_cast<uint32_t>(i * 2654435761u);
  std::memset(host_out.data(), 0xff, n * 4);
  auto h2d = gpu->create_stream("h2d");
  auto d2h = gpu->create_stream("d2h");
  auto copied = gpu->create_event();
  gpu->copy_async(dev.data(), host_in.data(), n * 4, CopyKind::host_to_device, *h2d);
  copied->record(*h2d);
  d2h->wait(*copied);
  gpu->copy_async(host_out.data(), dev.data(), n * 4, CopyKind::device_to_host, *d2h);
  d2h->synchronize();
  EXPECT_EQ(std::memcmp(host_in.data(), host_out.data(), n * 4), 0);
}

TEST_F(CudaBackendTest, HighPriorityStreamsGetTheDevicesGreatestPriority) {
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  auto normal = gpu->create_stream("normal");
  auto high = gpu->create_stream("comm", StreamPriority::high);
  int p_normal = 1, p_high = 1;
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(normal->native_handle()), &p_normal),
            cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(high->native_handle()), &p_high),
            cudaSuccess);
  EXPECT_EQ(p_normal, least);
  EXPECT_EQ(p_high, greatest);
}

TEST_F(CudaBackendTest, EventTiming) {
  auto s = gpu->create_stream("timed");
  auto start = gpu->create_event(EventTiming::on);
  auto end = gpu->create_event(EventTiming::on);
  auto dev = gpu->alloc(64ull << 20, LiveSet::workspace, "x");
  start->record(*s);
  gpu->memset_async(dev.data(), 0, 64ull << 20, *s);
  end->record(*s);
  end->synchronize();
  EXPECT_TRUE(end->query());
  EXPECT_GE(end->elapsed_ms(*start), 0.0);
  auto untimed = gpu->create_event();  // cudaEventDisableTiming
  untimed->record(*s);
  untimed->synchronize();
  EXPECT_THROW(end->elapsed_ms(*untimed), Error);
}

TEST_F(CudaBackendTest, FillAndConvertMatchTheCpuBitForBit) {
  constexpr int64_t n = 100003;  // not a multiple of any block size
  std::mt19937 rng(11);
  std::normal_distribution<double> dist(0.0, 2.0);
  std::vector<double> input(n);
  for (auto& v : input) v = dist(rng);

  auto run = [&](Backend& b, DType mid, std::vector<double>& result) {
    Stream& s = b.default_stream();
    auto staging = OwnedTensor::pinned(b, Shape{n}, DType::f64, LiveSet::workspace, "staging");
    std::memcpy(staging.data(), input.data(), n * 8);
    auto x = OwnedTensor::device(b, Shape{n}, DType::f64, LiveSet::workspace, "x");
    auto y = OwnedTensor::device(b, Shape{n}, mid, LiveSet::workspace, "y");
    auto z = OwnedTensor::device(b, Shape{n}, DType::f64, LiveSet::workspace, "z");
    b.copy_async(x.data(), staging.data(), n * 8, CopyKind::host_to_device, s);
    ops::fill(y, NAN, s);
    ops::convert(x, y, s);
    ops::convert(y, z, s);
    b.copy_async(staging.data(), z.data(), n * 8, CopyKind::device_to_host, s);
    s.synchronize();
    result.assign(staging.data_as<double>(), staging.data_as<double>() + n);
  };
  for (DType mid : {DType::f32, DType::bf16}) {
    std::vector<double> on_gpu, on_cpu;
    run(*gpu, mid, on_gpu);
    run(*cpu, mid, on_cpu);
    ASSERT_EQ(std::memcmp(on_gpu.data(), on_cpu.data(), n * 8), 0) << dtype_name(mid);
  }
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    Stream& s = gpu->default_stream();
    auto x = OwnedTensor::device(*gpu, Shape{n}, t, LiveSet::workspace, "x");
    auto h = OwnedTensor::pinned(*gpu, Shape{n}, t, LiveSet::workspace, "h");
    ops::fill(x, -5.0, s);
    gpu->copy_async(h.data(), x.data(), x.nbytes(), CopyKind::device_to_host, s);
    s.synchronize();
    uint64_t pattern = ops::fill_pattern(t, -5.0);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(
          std::memcmp(static_cast<char*>(h.data()) + i * dtype_size(t), &pattern, dtype_size(t)), 0)
          << dtype_name(t) << " element " << i;
    }
  }
}

}  // namespace
}  // namespace moepeak
