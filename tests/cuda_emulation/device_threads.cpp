// One fiber per CUDA thread (ucontext), the block's scheduler, barriers and warp collectives
// (see device_threads.h).
//
// NOTES: the scheduler runs every runnable fiber of the block once per round, each until it
// waits at a barrier or returns; then it releases every barrier all of whose threads have
// arrived. So between two barriers a thread's whole stretch runs before the next thread's: a
// missing barrier shows as a read of what was there before. Exited threads count as arrived at
// __syncthreads (as on sm_70 and later); a warp collective needs every lane of its mask.
#include "tests/cuda_emulation/device_threads.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace moepeak::cuda_emulation {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;
constexpr size_t kMaxStaticPlusDynamicShared = 227 * 1024;  // sm_90's opt-in limit

enum class State { runnable, block_barrier, warp_barrier, done };
enum class WarpOp { sync, ballot, exchange };

struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  State state = State::runnable;
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  uint64_t deposit = 0, result = 0;
  int lane_xor = 0, width = kWarp;
};

struct BlockRun {
  Dim3 grid, block, block_index;
  std::vector<Fiber> fibers;
  std::vector<unsigned char> shared;
  // Static __shared__ arrays of the block in flight, by declaration site (static_shared).
  std::map<const void*, std::unique_ptr<unsigned char[]>> static_shared;
  size_t static_shared_bytes = 0;
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  int current = -1;
  std::exception_ptr failure;
};

thread_local BlockRun* g_run = nullptr;

BlockRun& run() {
  MOEPEAK_CHECK(g_run != nullptr && g_run->current >= 0,
                "a CUDA built-in was called outside an emulated kernel launch");
  return *g_run;
}

Fiber& me() { return run().fibers[static_cast<size_t>(run().current)]; }

void trampoline() {
  BlockRun& r = *g_run;
  try {
    (*r.body)();
  } catch (...) {
    if (!r.failure) r.failure = std::current_exception();
  }
  r.fibers[static_cast<size_t>(r.current)].state = State::done;
  // Returns to uc_link: the scheduler.
}

void wait(State state) {
  BlockRun& r = run();
  Fiber& f = me();
  f.state = state;
  swapcontext(&f.context, &r.scheduler);
}

std::string block_name(const BlockRun& r) {
  return "block (" + std::to_string(r.block_index.x) + ", " + std::to_string(r.block_index.y) +
         ", " + std::to_string(r.block_index.z) + ")";
}

// Releases warp `w`'s collective when every lane of its mask has arrived; throws when it never
// can. Returns whether it released.
bool release_warp(BlockRun& r, int w) {
  const int n = static_cast<int>(r.fibers.size());
  const int first = w * kWarp, last = std::min(n, first + kWarp);
  int waiting = -1;
  for (int t = first; t < last; ++t) {
    if (r.fibers[t].state == State::warp_barrier) waiting = t;
  }
  if (waiting < 0) return false;
  const Fiber& lead = r.fibers[waiting];
  for (int t = first; t < last; ++t) {
    const Fiber& f = r.fibers[t];
    const bool in_mask = (lead.mask >> (t - first)) & 1u;
    if (f.state == State::warp_barrier) {
      MOEPEAK_CHECK(f.mask == lead.mask && f.op == lead.op, block_name(r), ": lanes ", t - first,
                    " and ", waiting - first, " of warp ", w,
                    " wait at different warp collectives (masks ", f.mask, " and ", lead.mask, ")");
      MOEPEAK_CHECK(in_mask, block_name(r), ": lane ", t - first, " of warp ", w,
                    " calls a warp collective whose mask ", lead.mask, " leaves it out");
    } else if (in_mask) {
      if (f.state == State::runnable) return false;  // still on its way
      MOEPEAK_CHECK(f.state != State::done, block_name(r), ": lane ", t - first, " of warp ", w,
                    " exited while the lanes of mask ", lead.mask, " wait for it at a warp ",
                    "collective");
      return false;  // at __syncthreads: reported as a deadlock if nothing else moves
    }
  }
  unsigned ballot = 0;
  for (int t = first; t < last; ++t) {
    if (r.fibers[t].state == State::warp_barrier && r.fibers[t].deposit) {
      ballot |= 1u << (t - first);
    }
  }
  for (int t = first; t < last; ++t) {
    Fiber& f = r.fibers[t];
    if (f.state != State::warp_barrier) continue;
    const int lane = t - first, partner = lane ^ f.lane_xor;
    const bool same_group = partner / f.width == lane / f.width;
    const int pt = first + partner;
    if (f.op == WarpOp::ballot) {
      f.result = ballot;
    } else if (f.op == WarpOp::exchange) {
      f.result = same_group && partner < kWarp && pt < last && ((f.mask >> partner) & 1u)
                     ? r.fibers[pt].deposit
                     : f.deposit;
    }
    f.state = State::runnable;
  }
  return true;
}

void run_block(BlockRun& r, Order order) {
  const int n = static_cast<int>(r.fibers.size());
  for (int t = 0; t < n; ++t) {
    Fiber& f = r.fibers[t];
    f.state = State::runnable;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &r.scheduler;
    makecontext(&f.context, trampoline, 0);
  }
  // Poisoned dynamic shared memory (a block without any has a null data(): memset of it is UB).
  if (!r.shared.empty()) std::memset(r.shared.data(), 0xff, r.shared.size());
  r.static_shared.clear();
  r.static_shared_bytes = 0;
  for (;;) {
    for (int k = 0; k < n; ++k) {
      const int t = order == Order::forward ? k : n - 1 - k;
      if (r.fibers[t].state != State::runnable) continue;
      r.current = t;
      swapcontext(&r.scheduler, &r.fibers[t].context);
      r.current = -1;
      if (r.failure) std::rethrow_exception(r.failure);
    }
    int live = 0, at_block = 0;
    for (const Fiber& f : r.fibers) {
      live += f.state != State::done;
      at_block += f.state == State::block_barrier;
    }
    if (live == 0) return;
    bool released = false;
    for (int w = 0; w * kWarp < n; ++w) released |= release_warp(r, w);
    if (at_block == live) {
      for (Fiber& f : r.fibers) {
        if (f.state == State::block_barrier) f.state = State::runnable;
      }
      released = true;
    }
    if (!released) {
      MOEPEAK_THROW(block_name(r), ": deadlock: ", at_block, " of ", live,
                    " live threads wait at __syncthreads while the others wait at warp "
                    "collectives that cannot complete (a barrier in divergent code)");
    }
  }
}

}  // namespace

void launch(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body,
            Order order) {
  MOEPEAK_CHECK(block.count() >= 1 && block.count() <= 1024, "a block of ", block.count(),
                " threads (1..1024)");
  MOEPEAK_CHECK(g_run == nullptr, "a kernel launched from inside a kernel");
  BlockRun r;
  r.grid = grid;
  r.block = block;
  r.body = &body;
  r.shared.resize(shared_bytes);
  r.fibers.resize(block.count());
  // NOTES: stacks are mapped once per OS thread and kept (1024 x 256 KiB of address space at
  // most; only the pages a kernel touches are ever backed).
  thread_local std::vector<char*> stacks;
  while (stacks.size() < r.fibers.size()) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    MOEPEAK_CHECK(p != MAP_FAILED, "cannot map a fiber stack of ", kStackBytes, " bytes");
    stacks.push_back(static_cast<char*>(p));
  }
  for (size_t t = 0; t < r.fibers.size(); ++t) r.fibers[t].stack = stacks[t];
  struct Cleanup {
    ~Cleanup() { g_run = nullptr; }
  } cleanup;
  g_run = &r;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        r.block_index = {x, y, z};
        run_block(r, order);
      }
    }
  }
}

Dim3 thread_index() {
  const BlockRun& r = run();
  const unsigned t = static_cast<unsigned>(r.current);
  return {t % r.block.x, t / r.block.x % r.block.y, t / (r.block.x * r.block.y)};
}
Dim3 block_index() { return run().block_index; }
Dim3 block_dim() { return run().block; }
Dim3 grid_dim() { return run().grid; }
void* dynamic_shared() { return run().shared.data(); }

namespace {
// The block's storage for `site` (static_shared_bytes, emulation_scratch_bytes); `counted`: it is
// the kernel's shared memory, held to the block's limit with the dynamic shared memory.
void* block_storage(const void* site, size_t bytes, size_t alignment, bool counted) {
  BlockRun& r = run();
  auto it = r.static_shared.find(site);
  if (it == r.static_shared.end()) {
    if (counted) {
      r.static_shared_bytes += bytes;
      MOEPEAK_CHECK(r.static_shared_bytes + r.shared.size() <= kMaxStaticPlusDynamicShared,
                    block_name(r), ": ", r.static_shared_bytes, " bytes of static and ",
                    r.shared.size(), " of dynamic shared memory, over the ",
                    kMaxStaticPlusDynamicShared, " a block can have");
    }
    auto storage = std::make_unique<unsigned char[]>(bytes + alignment);
    std::memset(storage.get(), 0xff, bytes + alignment);
    it = r.static_shared.emplace(site, std::move(storage)).first;
  }
  const auto base = reinterpret_cast<uintptr_t>(it->second.get());
  return reinterpret_cast<void*>((base + alignment - 1) / alignment * alignment);
}
}  // namespace

void* static_shared_bytes(const void* site, size_t bytes, size_t alignment) {
  return block_storage(site, bytes, alignment, /*counted=*/true);
}
void* emulation_scratch_bytes(const void* site, size_t bytes, size_t alignment) {
  return block_storage(site, bytes, alignment, /*counted=*/false);
}

void sync_threads() { wait(State::block_barrier); }

void sync_warp(unsigned mask) {
  Fiber& f = me();
  f.op = WarpOp::sync;
  f.mask = mask;
  wait(State::warp_barrier);
}

unsigned ballot(unsigned mask, bool predicate) {
  Fiber& f = me();
  f.op = WarpOp::ballot;
  f.mask = mask;
  f.deposit = predicate ? 1 : 0;
  wait(State::warp_barrier);
  return static_cast<unsigned>(me().result);
}

namespace detail {
uint64_t exchange_xor(unsigned mask, uint64_t mine, int lane_xor, int width) {
  MOEPEAK_CHECK(width >= 1 && width <= kWarp && (width & (width - 1)) == 0, "shfl_xor width ",
                width, " (a power of two up to 32)");
  Fiber& f = me();
  f.op = WarpOp::exchange;
  f.mask = mask;
  f.deposit = mine;
  f.lane_xor = lane_xor;
  f.width = width;
  wait(State::warp_barrier);
  return me().result;
}
}  // namespace detail

}  // namespace moepeak::cuda_emulation
