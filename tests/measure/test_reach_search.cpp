// The bracketing search of `moepeak bench reach` (core/measure/reach_search.h) against an oracle:
// for every true limit and every seed the plan could give (exact, too cautious, too hopeful,
// none), the search returns the true limit rounded to its step and the failure one step above
// it, in a logarithmic number of probes, never probing past its bounds or off its step.
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
  for (int64_t step : {1, 64, 100}) {
    const int64_t max = 400 * step;
    for (int64_t truth : {int64_t{0}, step - 1, step, 3 * step + 1, 57 * step, 399 * step,
                          400 * step, 1000 * step}) {
      for (int64_t planned : {int64_t{0}, step, truth, truth / 3, 2 * truth + 5, max, 5 * max}) {
        const std::string what = "step " + std::to_string(step) + " truth " +
                                 std::to_string(truth) + " planned " + std::to_string(planned);
        const ReachSearch s =
            search_reach({planned, step, max}, [&](int64_t v) { return v <= truth; });
        const int64_t want = std::min(truth, max) / step * step;
        EXPECT_EQ(s.limit, want) << what;
        if (want < max) {
          EXPECT_EQ(s.first_failed, want + step) << what;  // the bracket is one step wide
        } else {
          EXPECT_EQ(s.first_failed, 0) << what;  // the bound trained: nothing failed
        }
        for (const ReachProbe& p : s.probes) {
          EXPECT_EQ(p.value % step, 0) << what;
          EXPECT_GE(p.value, step) << what;
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
}

}  // namespace
}  // namespace moepeak::measure
