// The bracketing search of `moepeak bench reach` (see reach_search.h).
#include "core/measure/reach_search.h"

#include <algorithm>

#include "core/error.h"

namespace moepeak::measure {

ReachSearch search_reach(const ReachSearchInputs& in,
                         const std::function<bool(int64_t value)>& trains) {
  MOEPEAK_CHECK(in.step >= 1 && in.max >= in.step, "reach search: step ", in.step, ", max ", in.max,
                " (a step >= 1 and max >= step expected)");
  const int64_t step = in.step, top = in.max / step * step;
  const int64_t bottom = in.lowest > 0 ? in.lowest : step;
  MOEPEAK_CHECK(bottom % step == 0 && bottom <= top, "reach search: lowest ", in.lowest,
                " (a multiple of step ", step, " up to max ", in.max, " expected)");
  ReachSearch s;
  auto probe = [&](int64_t v) {
    const bool ok = trains(v);
    s.probes.push_back({v, ok});
    return ok;
  };
  auto down_to_step = [&](int64_t v) { return std::clamp(v / step * step, bottom, top); };
  // Up (or down) by a quarter, at least one step.
  auto grow = [&](int64_t v) { return down_to_step(std::max(v + step, v + v / 4)); };
  auto shrink = [&](int64_t v) { return down_to_step(std::min(v - step, v - v / 4)); };

  int64_t lo = 0, hi = 0;  // lo trained (0: none yet), hi failed (0: none yet)
  int64_t v = down_to_step(std::max(in.planned, bottom));
  if (probe(v)) {
    lo = v;
    while (lo < top) {
      v = grow(lo);
      if (!probe(v)) {
        hi = v;
        break;
      }
      lo = v;
    }
  } else {
    hi = v;
    while (hi > bottom) {
      v = shrink(hi);
      if (probe(v)) {
        lo = v;
        break;
      }
      hi = v;
    }
  }
  // Halve the bracket (lo, hi) down to one step; lo = 0 means only hi = bottom failed.
  while (lo > 0 && hi > 0 && hi - lo > step) {
    v = lo + (hi - lo) / 2 / step * step;
    if (probe(v)) {
      lo = v;
    } else {
      hi = v;
    }
  }
  s.limit = lo;
  s.first_failed = hi;
  return s;
}

}  // namespace moepeak::measure
