// The emulated execution model (device_threads.h): barriers and warp collectives behave as on a
// GPU for correct kernels, and the bugs the emulation exists to catch — a missing
// __syncthreads, a collective a lane never reaches, a barrier in divergent code — show as wrong
// results or as Errors naming the block and lanes, never as a hang.
#include "tests/cuda_emulation/device_threads.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace moepeak::cuda_emulation {
namespace {

constexpr unsigned kFull = 0xffffffffu;

unsigned linear_thread() {
  const Dim3 t = thread_index(), b = block_dim();
  return t.x + b.x * (t.y + b.y * t.z);
}

// out[t] = t's mirror through dynamic shared memory, with or without the barrier between the
// writes and the reads.
std::vector<float> mirror(unsigned n, bool barrier, Order order) {
  std::vector<float> out(n, -1.0f);
  launch(
      {1}, {n}, n * sizeof(float),
      [&] {
        float* s = static_cast<float*>(dynamic_shared());
        const unsigned t = linear_thread();
        s[t] = static_cast<float>(t);
        if (barrier) sync_threads();
        out[t] = s[n - 1 - t];
      },
      order);
  return out;
}

TEST(CudaEmulation, SharedMemoryAcrossABarrierIsEveryThreadsWrite) {
  for (Order order : {Order::forward, Order::reverse}) {
    const std::vector<float> out = mirror(128, true, order);
    for (unsigned t = 0; t < 128; ++t) EXPECT_EQ(out[t], static_cast<float>(127 - t));
  }
}

TEST(CudaEmulation, AMissingBarrierReadsThePoisonedSharedMemory) {
  // Forward order: the low threads read before the high ones wrote; reverse: the other half.
  for (Order order : {Order::forward, Order::reverse}) {
    const std::vector<float> out = mirror(128, false, order);
    int poisoned = 0;
    for (float v : out) poisoned += std::isnan(v);
    EXPECT_EQ(poisoned, 64) << (order == Order::forward ? "forward" : "reverse");
  }
}

TEST(CudaEmulation, ShuffleXorReducesEachWarp) {
  std::vector<float> out(96, 0.0f);
  launch({1}, {96}, 0, [&] {
    const unsigned t = linear_thread();
    float v = static_cast<float>(t + 1);
    for (int offset = 16; offset >= 1; offset /= 2) v += shfl_xor(kFull, v, offset);
    out[t] = v;
  });
  for (unsigned t = 0; t < 96; ++t) {
    const unsigned w = t / 32;  // lanes 32w .. 32w+31 hold 32w+1 .. 32w+32
    EXPECT_EQ(out[t], static_cast<float>(32 * (32 * w) + 32 * 33 / 2)) << "thread " << t;
  }
}

TEST(CudaEmulation, ShuffleXorWithinWidthAndDoubles) {
  std::vector<double> out(32);
  launch({1}, {32}, 0, [&] {
    const unsigned t = linear_thread();
    out[t] = shfl_xor(kFull, static_cast<double>(t) + 0.5, 1, 2);  // swap neighbours
  });
  for (unsigned t = 0; t < 32; ++t) EXPECT_EQ(out[t], static_cast<double>(t ^ 1u) + 0.5);
}

TEST(CudaEmulation, BallotAndSyncWarp) {
  std::vector<unsigned> out(64);
  launch({1}, {64}, 0, [&] {
    const unsigned t = linear_thread();
    sync_warp(kFull);
    out[t] = ballot(kFull, t % 3 == 0);
  });
  for (unsigned t = 0; t < 64; ++t) {
    unsigned want = 0;
    for (unsigned lane = 0; lane < 32; ++lane) want |= ((t / 32 * 32 + lane) % 3 == 0) << lane;
    EXPECT_EQ(out[t], want) << "thread " << t;
  }
}

TEST(CudaEmulation, EveryBlockAndThreadIndexOnce) {
  std::set<std::tuple<unsigned, unsigned, unsigned, unsigned>> seen;
  launch({3, 2}, {4, 2}, 0, [&] {
    const Dim3 b = block_index(), t = thread_index();
    EXPECT_EQ(grid_dim().x, 3u);
    EXPECT_EQ(block_dim().y, 2u);
    seen.insert({b.x, b.y, t.x, t.y});
  });
  EXPECT_EQ(seen.size(), 3u * 2u * 4u * 2u);
}

TEST(CudaEmulation, ExitedThreadsCountAsArrivedAtSyncThreads) {
  int after = 0;
  launch({1}, {64}, 0, [&] {
    if (linear_thread() >= 40) return;
    sync_threads();
    ++after;
  });
  EXPECT_EQ(after, 40);
}

TEST(CudaEmulation, ACollectiveALaneNeverReachesIsAnError) {
  EXPECT_THROW(launch({1}, {32}, 0,
                      [&] {
                        if (linear_thread() >= 16) return;
                        (void)shfl_xor(kFull, 1.0f, 1);
                      }),
               Error);
}

TEST(CudaEmulation, ALaneOutsideItsOwnMaskIsAnError) {
  EXPECT_THROW(launch({1}, {32}, 0, [&] { (void)ballot(0x0000ffffu, true); }), Error);
}

TEST(CudaEmulation, ABarrierInDivergentCodeIsADeadlockError) {
  // Lanes 0..15 wait at __syncthreads, 16..31 at a full-warp collective: neither can finish.
  try {
    launch({1}, {32}, 0, [&] {
      if (linear_thread() < 16) {
        sync_threads();
      } else {
        sync_warp(kFull);
      }
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(CudaEmulation, AThreadsExceptionReachesTheLauncher) {
  EXPECT_THROW(launch({2}, {8}, 0,
                      [&] {
                        sync_threads();
                        if (block_index().x == 1 && linear_thread() == 5) {
                          throw std::runtime_error("device assert");
                        }
                      }),
               std::runtime_error);
  EXPECT_THROW(thread_index(), Error) << "built-ins outside a launch are an error";
}

}  // namespace
}  // namespace moepeak::cuda_emulation
