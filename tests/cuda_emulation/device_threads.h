// The CPU emulation of CUDA's execution model, the part every kernel needs: one fiber per CUDA
// thread, a block's fibers run on one OS thread, with real barriers and warp collectives.
//
//   cuda_emulation::Dim3 grid{4}, block{256};
//   cuda_emulation::launch(grid, block, /*dynamic shared bytes*/ 1024, [&] {
//     const Dim3 t = cuda_emulation::thread_index();      // threadIdx
//     ... cuda_emulation::sync_threads();                   // __syncthreads()
//     float s = cuda_emulation::shfl_xor(0xffffffffu, v, 16);  // __shfl_xor_sync
//   });
//
// How it finds bugs a plain sequential loop would hide:
//   - threads run one after another up to their next barrier, in thread order or (Order::reverse)
//     the other way, so a read of shared memory another thread writes before a barrier that is
//     missing sees the value of before (NaN, for the poisoned dynamic shared memory);
//   - a __syncthreads that not every live thread of the block reaches, a warp collective whose
//     mask names a lane that never arrives, or a lane that calls one outside the mask, is an
//     Error naming the block, the threads and the barrier, not a hang;
//   - dynamic shared memory starts as NaN bytes (0xff) at every block.
// What it cannot see: races between threads that need real concurrency (fibers of a block never
// run at once), timing, and the memory model's weaker orderings.
// Blocks of one launch run one after another on the calling thread. Test: ctest -R
// test_cuda_emulation
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

namespace moepeak::cuda_emulation {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t{x} * y * z; }
};

enum class Order { forward, reverse };  // the order a block's threads run between barriers

// Runs `body` once per thread of every block of `grid` (x fastest), each block's threads as
// fibers with `shared_bytes` of dynamic shared memory poisoned with 0xff. Throws moepeak::Error
// for a broken barrier (see above) or rethrows what a thread threw; `order` as above.
void launch(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body,
            Order order = Order::forward);

// The calling fiber's CUDA built-ins (only inside launch()).
Dim3 thread_index();     // threadIdx
Dim3 block_index();      // blockIdx
Dim3 block_dim();        // blockDim
Dim3 grid_dim();         // gridDim
void* dynamic_shared();  // extern __shared__ memory of this block, 0xff at the block's start
// A static __shared__ array of this block (device_prelude.h's static_shared): the same storage
// for every thread of the block that passes `site`, fresh and 0xff at the block's first call.
void* static_shared_bytes(const void* site, size_t bytes, size_t alignment);
// The same for storage the emulation itself needs where the hardware uses none (the WMMA
// emulation's operand exchange, include/mma.h): not counted against the block's shared memory,
// so a kernel keeps the hardware's whole budget.
void* emulation_scratch_bytes(const void* site, size_t bytes, size_t alignment);

void sync_threads();                             // __syncthreads()
void sync_warp(unsigned mask);                   // __syncwarp(mask)
unsigned ballot(unsigned mask, bool predicate);  // __ballot_sync(mask, predicate)

namespace detail {
// Every lane of `mask` deposits 8 bytes and receives lane (its lane ^ lane_xor)'s deposit, taken
// within groups of `width` lanes; a partner outside the mask or the warp returns the lane's own.
uint64_t exchange_xor(unsigned mask, uint64_t mine, int lane_xor, int width);
}  // namespace detail

// __shfl_xor_sync(mask, value, lane_mask, width) for values of up to 8 bytes.
template <typename T>
T shfl_xor(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "8-byte values at most");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const uint64_t got = detail::exchange_xor(mask, bits, lane_mask, width);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

}  // namespace moepeak::cuda_emulation
