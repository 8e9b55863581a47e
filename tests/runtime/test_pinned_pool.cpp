// PinnedPool: NUMA-local host memory with its own budget, accounting and block reuse.
// Run: ctest -R test_pinned_pool
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/runtime/numa.h"
#include "core/runtime/pinned_pool.h"

namespace moepeak {
namespace {

constexpr uint64_t kBlock = PinnedPool::kBlockGranularity;

TEST(PinnedPool, AccountsAndEnforcesBudget) {
  PinnedPool pool(8 * kBlock, -1, nullptr);
  EXPECT_EQ(pool.numa_node(), current_numa_node());
  Buffer a = pool.alloc(3 * kBlock, LiveSet::boundaries, "layer 0 boundary");
  Buffer b = pool.alloc(kBlock + 1, LiveSet::optimizer, "bucket 0 master/m/v");  // -> 2 blocks
  std::memset(a.data(), 0x5a, a.bytes());  // the memory is really there
  std::memset(b.data(), 0x11, b.bytes());
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.current()[LiveSet::boundaries], 3 * kBlock);
  EXPECT_EQ(s.current()[LiveSet::optimizer], 2 * kBlock);
  try {
    Buffer c = pool.alloc(4 * kBlock, LiveSet::boundaries, "layer 1 boundary");
    FAIL() << "expected out of pinned host memory";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of pinned host memory"), std::string::npos) << m;
    EXPECT_NE(m.find("layer 1 boundary"), std::string::npos) << m;
    EXPECT_NE(m.find("budget 16.00 MiB"), std::string::npos) << m;
  }
  EXPECT_EQ(pool.stats().current_total(), 5 * kBlock);
}

TEST(PinnedPool, ReusesFreedBlocksAndTrimsToStayInBudget) {
  PinnedPool pool(4 * kBlock, -1, nullptr);
  void* first;
  {
    Buffer a = pool.alloc(2 * kBlock, LiveSet::boundaries, "a");
    first = a.data();
  }
  EXPECT_EQ(pool.cached_bytes(), 2 * kBlock);
  Buffer again = pool.alloc(2 * kBlock, LiveSet::boundaries, "again");
  EXPECT_EQ(again.data(), first);  // pinned once, reused
  again.reset();
  // A request of another size that only fits once the cached block is given back.
  Buffer big = pool.alloc(3 * kBlock, LiveSet::optimizer, "big");
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.stats().current_total(), 3 * kBlock);
  EXPECT_EQ(pool.stats().peak_total(), 3 * kBlock);
}

TEST(PinnedPool, RejectsMissingNumaNode) {
  EXPECT_THROW(PinnedPool(kBlock, numa_node_count() + 7, nullptr), Error);
}

}  // namespace
}  // namespace moepeak
