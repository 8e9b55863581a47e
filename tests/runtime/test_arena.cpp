// DeviceArena: live-set accounting (current, peak, breakdown at the total peak, per phase of a
// step), best-fit with coalescing, and the out-of-memory error. Run: ctest -R test_arena
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/runtime/arena.h"

namespace moepeak {
namespace {

constexpr uint64_t kA = DeviceArena::kAlignment;

struct ArenaFixture : ::testing::Test {
  std::vector<char> region = std::vector<char>(64 * kA);
  DeviceArena arena{region.data(), region.size(), "test arena"};
};

TEST_F(ArenaFixture, AccountsFootprintPerLiveSet) {
  Buffer w = arena.alloc(100, LiveSet::weights, "w");  // rounds up to one alignment unit
  Buffer g = arena.alloc(3 * kA, LiveSet::grads, "g");
  MemoryStats s = arena.stats();
  EXPECT_EQ(s.current()[LiveSet::weights], kA);
  EXPECT_EQ(s.current()[LiveSet::grads], 3 * kA);
  EXPECT_EQ(s.current_total(), 4 * kA);
  EXPECT_EQ(arena.used(), 4 * kA);
  EXPECT_EQ(DeviceArena::footprint(100), kA);
  EXPECT_EQ(DeviceArena::footprint(kA + 1), 2 * kA);
  w.reset();
  EXPECT_EQ(arena.stats().current()[LiveSet::weights], 0u);
  EXPECT_EQ(arena.stats().peak_per_set()[LiveSet::weights], kA);
}

TEST_F(ArenaFixture, BreakdownAtPeakIsTheMomentOfTheTotalPeak) {
  // Phase 1: 10 units of logits alone. Phase 2: 6 units of dispatch + 6 of boundaries = 12 (the
  // total peak), while logits' own peak (10) came earlier. The breakdown must show phase 2.
  { Buffer logits = arena.alloc(10 * kA, LiveSet::logits, "logits"); }
  Buffer d = arena.alloc(6 * kA, LiveSet::dispatch, "dispatch");
  Buffer b = arena.alloc(6 * kA, LiveSet::boundaries, "boundaries");
  d.reset();
  b.reset();
  MemoryStats s = arena.stats();
  EXPECT_EQ(s.peak_total(), 12 * kA);
  EXPECT_EQ(s.at_peak()[LiveSet::dispatch], 6 * kA);
  EXPECT_EQ(s.at_peak()[LiveSet::boundaries], 6 * kA);
  EXPECT_EQ(s.at_peak()[LiveSet::logits], 0u);
  EXPECT_EQ(s.peak_per_set()[LiveSet::logits], 10 * kA);
  EXPECT_EQ(s.at_peak().total(), s.peak_total());

  arena.reset_peaks();
  EXPECT_EQ(arena.stats().peak_total(), 0u);
  EXPECT_EQ(arena.stats().peak_per_set()[LiveSet::logits], 0u);
}

TEST_F(ArenaFixture, EachPhaseKeepsItsOwnPeakAndTheSetsAtIt) {
  // head: 4 units of boundaries + 10 of logits (14); backward_experts: the logits freed, 6 units
  // of dispatch (10); what is live when a phase starts counts in it.
  Buffer b = arena.alloc(4 * kA, LiveSet::boundaries, "boundaries");
  arena.set_phase(StepPhase::head);
  { Buffer logits = arena.alloc(10 * kA, LiveSet::logits, "logits"); }
  arena.set_phase(StepPhase::backward_experts);
  { Buffer d = arena.alloc(6 * kA, LiveSet::dispatch, "dispatch"); }
  arena.set_phase(StepPhase::optimizer);
  b.reset();
  MemoryStats s = arena.stats();
  EXPECT_EQ(s.phase_peak(StepPhase::head), 14 * kA);
  EXPECT_EQ(s.phase_at_peak(StepPhase::head)[LiveSet::logits], 10 * kA);
  EXPECT_EQ(s.phase_peak(StepPhase::backward_experts), 10 * kA);
  EXPECT_EQ(s.phase_at_peak(StepPhase::backward_experts)[LiveSet::dispatch], 6 * kA);
  EXPECT_EQ(s.phase_at_peak(StepPhase::backward_experts)[LiveSet::logits], 0u);
  EXPECT_EQ(s.phase_peak(StepPhase::optimizer), 4 * kA);  // the boundaries when it began
  EXPECT_EQ(s.phase_peak(StepPhase::embedding), 4 * kA);  // the first phase
  EXPECT_EQ(s.phase_peaks().max(), s.peak_total());

  // A new window: every phase but the current one starts at 0, the current at what is live.
  Buffer w = arena.alloc(2 * kA, LiveSet::weights, "w");
  arena.reset_peaks();
  s = arena.stats();
  EXPECT_EQ(s.phase_peak(StepPhase::optimizer), 2 * kA);
  EXPECT_EQ(s.phase_peak(StepPhase::head), 0u);
}

TEST_F(ArenaFixture, EachPhaseKeepsEverySetsOwnPeak) {
  // forward_attention: attention 3, freed, then workspace 5 (the phase's total peaks at 5 with no
  // attention live, but attention's own peak in it is 3), then 2 of attention kept;
  // backward_attention: the 2 alive when it begins count, then 4 on top.
  arena.set_phase(StepPhase::forward_attention);
  { Buffer a = arena.alloc(3 * kA, LiveSet::attention, "a"); }
  { Buffer w = arena.alloc(5 * kA, LiveSet::workspace, "w"); }
  Buffer kept = arena.alloc(2 * kA, LiveSet::attention, "kept");
  arena.set_phase(StepPhase::backward_attention);
  { Buffer a = arena.alloc(4 * kA, LiveSet::attention, "a"); }
  kept.reset();
  arena.set_phase(StepPhase::optimizer);
  const MemoryStats s = arena.stats();
  EXPECT_EQ(s.phase_peak(StepPhase::forward_attention), 5 * kA);
  EXPECT_EQ(s.phase_at_peak(StepPhase::forward_attention)[LiveSet::attention], 0u);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::forward_attention)[LiveSet::attention], 3 * kA);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::forward_attention)[LiveSet::workspace], 5 * kA);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::backward_attention)[LiveSet::attention], 6 * kA);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::backward_attention)[LiveSet::workspace], 0u);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::optimizer).total(), 0u);
  EXPECT_EQ(s.phase_peak_per_set(StepPhase::head).total(), 0u);  // never entered

  // A new window: only the current phase starts at what is live.
  Buffer w = arena.alloc(1 * kA, LiveSet::weights, "w");
  arena.reset_peaks();
  EXPECT_EQ(arena.stats().phase_peak_per_set(StepPhase::optimizer)[LiveSet::weights], kA);
  EXPECT_EQ(arena.stats().phase_peak_per_set(StepPhase::backward_attention).total(), 0u);
}

TEST_F(ArenaFixture, OutOfMemoryNamesRequestAndLiveSets) {
  Buffer w = arena.alloc(40 * kA, LiveSet::weights, "layer weights");
  try {
    Buffer too_big = arena.alloc(30 * kA, LiveSet::dispatch, "chunk 3 receive buffer");
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of device memory"), std::string::npos) << m;
    EXPECT_NE(m.find("dispatch"), std::string::npos) << m;
    EXPECT_NE(m.find("chunk 3 receive buffer"), std::string::npos) << m;
    EXPECT_NE(m.find("7.50 KiB"), std::string::npos) << m;           // 30 * 256 bytes requested
    EXPECT_NE(m.find("weights 10.00 KiB"), std::string::npos) << m;  // live sets at that moment
    EXPECT_NE(m.find("arena.cpp"), std::string::npos) << m;
  }
  // A failed request changes nothing.
  EXPECT_EQ(arena.used(), 40 * kA);
}

TEST_F(ArenaFixture, FragmentationCanFailWhileTotalFreeWouldFit) {
  std::vector<Buffer> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(arena.alloc(kA, LiveSet::workspace, "block"));
  for (int i = 0; i < 64; i += 2) blocks[i].reset();  // 32 free units, none adjacent
  EXPECT_THROW(arena.alloc(2 * kA, LiveSet::workspace, "two units"), Error);
  EXPECT_EQ(arena.largest_free_block(), kA);
  for (int i = 1; i < 64; i += 2) blocks[i].reset();  // everything free: coalesced into one block
  EXPECT_EQ(arena.largest_free_block(), 64 * kA);
  Buffer all = arena.alloc(64 * kA, LiveSet::workspace, "everything");
  EXPECT_EQ(all.data(), region.data());
}

TEST_F(ArenaFixture, HighWaterIsTheHighestBlockEndSinceTheReset) {
  Buffer a = arena.alloc(4 * kA, LiveSet::workspace, "a");  // [0, 4)
  Buffer b = arena.alloc(2 * kA, LiveSet::workspace, "b");  // [4, 6)
  EXPECT_EQ(arena.high_water(), 6 * kA);
  a.reset();
  // 3 units do not need new space: the hole [0, 4) takes them, the high water stays.
  Buffer c = arena.alloc(3 * kA, LiveSet::workspace, "c");  // [0, 3)
  EXPECT_EQ(arena.high_water(), 6 * kA);
  // 2 more live units than the hole's remaining 1 can hold: the region grows past the live bytes.
  Buffer d = arena.alloc(2 * kA, LiveSet::workspace, "d");  // [6, 8)
  EXPECT_EQ(arena.high_water(), 8 * kA);
  EXPECT_EQ(arena.stats().peak_total(), 7 * kA);  // 1 unit of fragmentation past the peak
  b.reset();
  d.reset();
  arena.reset_peaks();  // c is still live: the high water starts at its end
  EXPECT_EQ(arena.high_water(), 3 * kA);
  c.reset();
  arena.reset_peaks();
  EXPECT_EQ(arena.high_water(), 0u);
}

TEST_F(ArenaFixture, BestFitReusesTheSmallestHole) {
  Buffer a = arena.alloc(4 * kA, LiveSet::workspace, "a");
  Buffer sep1 = arena.alloc(kA, LiveSet::workspace, "sep1");
  Buffer b = arena.alloc(2 * kA, LiveSet::workspace, "b");
  Buffer sep2 = arena.alloc(kA, LiveSet::workspace, "sep2");
  void* b_addr = b.data();
  a.reset();
  b.reset();
  Buffer c = arena.alloc(2 * kA, LiveSet::workspace, "c");
  EXPECT_EQ(c.data(), b_addr);
}

TEST_F(ArenaFixture, BuffersMoveWithoutDoubleFree) {
  Buffer a = arena.alloc(kA, LiveSet::grads, "a");
  Buffer b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(arena.stats().current()[LiveSet::grads], kA);
  b = Buffer();
  EXPECT_EQ(arena.stats().current()[LiveSet::grads], 0u);
}

TEST(LiveSets, NamesRoundTrip) {
  for (LiveSet s : kAllLiveSets) {
    auto back = live_set_from_name(live_set_name(s));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, s);
  }
  EXPECT_FALSE(live_set_from_name("activations").has_value());
}

}  // namespace
}  // namespace moepeak
