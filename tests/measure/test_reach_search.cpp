// The bracketing search of `moepeak bench reach` (core/measure/reach_search.h) against an oracle:
// for every true limit and every seed the plan could give (exact, too cautious, too hopeful,
// none), the search returns the true limit rounded to its step and the failure one step above
// it, in a logarithmic number of probes, never probing past its bounds (the lowest value a run can
// be made at, max) or off its step.
// Run: ctest -R test_reach_search
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/measure/reach_search.h"

namespace moepeak::measure {
namespace {

TEST(ReachSearch, FindsTheOraclesLimitFromAnySeed) {
  int cases = 0, most_probes = 0;
  for (int64_t step : {1, 2, 64, 100}) {
    const int64_t max = 400 * step;
    // The lowest value a run can be made at: the default (one step), or a few steps up (as a
    // seq_len of 1 is none, so a step of 1 starts at 2).
    for (int64_t lowest : {int64_t{0}, 2 * step, 5 * step}) {
      const int64_t bottom = lowest > 0 ? lowest : step;
      for (int64_t truth : {int64_t{0}, step - 1, step, 2 * step, 3 * step + 1, 57 * step,
                            399 * step, 400 * step, 1000 * step}) {
        for (int64_t planned : {int64_t{0}, step, truth, truth / 3, 2 * truth + 5, max, 5 * max}) {
          const std::string what = "step " + std::to_string(step) + " lowest " +
                                   std::to_string(lowest) + " truth " + std::to_string(truth) +
                                   " planned " + std::to_string(planned);
          const ReachSearch s =
              search_reach({planned, step, max, lowest}, [&](int64_t v) { return v <= truth; });
          const int64_t want = truth < bottom ? 0 : std::min(truth, max) / step * step;
          EXPECT_EQ(s.limit, want) << what;
          if (want == 0) {
            EXPECT_EQ(s.first_failed, bottom) << what;  // not even the lowest trained
          } else if (want < max) {
            EXPECT_EQ(s.first_failed, want + step) << what;  // the bracket is one step wide
          } else {
            EXPECT_EQ(s.first_failed, 0) << what;  // the bound trained: nothing failed
          }
          for (const ReachProbe& p : s.probes) {
            EXPECT_EQ(p.value % step, 0) << what;
            EXPECT_GE(p.value, bottom) << what;
            EXPECT_LE(p.value, max) << what;
            EXPECT_EQ(p.trained, p.value <= truth) << what;
          }
          // Both ends of the bracket were probed, and no value twice.
          bool saw_limit = want == 0, saw_failed = s.first_failed == 0;
          for (size_t i = 0; i < s.probes.size(); ++i) {
            saw_limit |= s.probes[i].value == s.limit;
            saw_failed |= s.probes[i].value == s.first_failed;
            for (size_t j = 0; j < i; ++j) EXPECT_NE(s.probes[i].value, s.probes[j].value) << what;
          }
          EXPECT_TRUE(saw_limit && saw_failed) << what;
          // Logarithmic: the walk by quarters from the seed, then halving the bracket.
          EXPECT_LE(static_cast<int>(s.probes.size()), 40) << what;
          most_probes = std::max(most_probes, static_cast<int>(s.probes.size()));
          ++cases;
        }
      }
    }
  }
  std::printf("%d cases, at most %d probes\n", cases, most_probes);
}

TEST(ReachSearch, AnExactPlanTakesTwoProbes) {
  // The plan right: its value trains and one step more does not... after the walk up by a
  // quarter fails, the halving comes back down to it.
  const ReachSearch s = search_reach({1024, 64, 1 << 20}, [](int64_t v) { return v <= 1024; });
  EXPECT_EQ(s.limit, 1024);
  EXPECT_EQ(s.first_failed, 1088);
  EXPECT_LE(s.probes.size(), 5u);
}

TEST(ReachSearch, BadBoundsAreErrors) {
  EXPECT_THROW(search_reach({10, 0, 100}, [](int64_t) { return true; }), Error);
  EXPECT_THROW(search_reach({10, 64, 32}, [](int64_t) { return true; }), Error);
  // A lowest off the step, or past the bound.
  EXPECT_THROW(search_reach({10, 64, 1024, 100}, [](int64_t) { return true; }), Error);
  EXPECT_THROW(search_reach({10, 64, 1024, 1088}, [](int64_t) { return true; }), Error);
}

// No probe below the lowest value: a plan of 0 (nothing fits) seeds the search there, not at one
// step (bench reach on one rank probed training.seq_len = 1, which no run can be made at).
TEST(ReachSearch, StartsAtTheLowestValue) {
  const ReachSearch none = search_reach({0, 1, 100, 2}, [](int64_t) { return false; });
  ASSERT_EQ(none.probes.size(), 1u);
  EXPECT_EQ(none.probes[0].value, 2);
  EXPECT_EQ(none.limit, 0);
  EXPECT_EQ(none.first_failed, 2);
  const ReachSearch some = search_reach({0, 1, 100, 2}, [](int64_t v) { return v <= 30; });
  EXPECT_EQ(some.probes.front().value, 2);
  EXPECT_EQ(some.limit, 30);
  EXPECT_EQ(some.first_failed, 31);
}

}  // namespace
}  // namespace moepeak::measure
