// The selection rules of `moepeak tune` (select.h; docs/tune.md). Test: ctest -R test_tune_select
#include "core/tune/select.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/units.h"

namespace moepeak::tune {
namespace {

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", 1e3 * s);
  return buf;
}

std::string pct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

// The fastest median among the points the plan accepts; the caller has checked one does.
template <typename P>
double best_fitting(const std::vector<P>& points) {
  double best = std::numeric_limits<double>::infinity();
  for (const P& p : points) {
    if (p.plan_fits) best = std::min(best, p.time.median_s);
  }
  return best;
}

template <typename P>
bool any_fits(const std::vector<P>& points) {
  return std::any_of(points.begin(), points.end(), [](const P& p) { return p.plan_fits; });
}

}  // namespace

Timing summarize(const std::vector<double>& times_s) {
  MOEPEAK_CHECK(!times_s.empty(), "a measured point needs at least one repetition");
  std::vector<double> v = times_s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  Timing t;
  t.median_s = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  t.min_s = v.front();
  t.max_s = v.back();
  t.repeats = static_cast<int>(n);
  return t;
}

Choice select_chunk(const std::vector<DispatchPoint>& points, double tolerance) {
  if (points.empty()) MOEPEAK_INPUT_ERROR("tune: no chunk_tokens point was measured");
  if (!any_fits(points)) {
    // Name the point closest to fitting: the smallest dispatch peak.
    size_t lo = 0;
    std::ostringstream cs;
    for (size_t i = 0; i < points.size(); ++i) {
      cs << (i ? ", " : "") << points[i].chunk_tokens;
      if (points[i].bound_bytes < points[lo].bound_bytes) lo = i;
    }
    const DispatchPoint& p = points[lo];
    MOEPEAK_INPUT_ERROR("tune: no chunk_tokens in {", cs.str(),
                        "} fits the plan: the smallest dispatch peak ", format_bytes(p.bound_bytes),
                        " (c = ", p.chunk_tokens, ", K_max = ", p.max_chunks, ") ", p.plan_note);
  }
  const double best = best_fitting(points);
  size_t pick = points.size();
  for (size_t i = 0; i < points.size(); ++i) {
    const DispatchPoint& p = points[i];
    if (!p.plan_fits || p.time.median_s > best * (1 + tolerance)) continue;
    if (pick == points.size()) {
      pick = i;
      continue;
    }
    const DispatchPoint& q = points[pick];
    if (p.chunk_eff < q.chunk_eff ||
        (p.chunk_eff == q.chunk_eff && p.bound_bytes < q.bound_bytes) ||
        (p.chunk_eff == q.chunk_eff && p.bound_bytes == q.bound_bytes &&
         p.chunk_tokens < q.chunk_tokens)) {
      pick = i;
    }
  }
  const DispatchPoint& p = points[pick];
  std::ostringstream why;
  why << "smallest chunk within " << pct(tolerance) << " of the fastest point the plan accepts ("
      << ms(best) << "): c = " << p.chunk_tokens << ", K_max = " << p.max_chunks
      << " -> K = " << p.chunks << ", c_eff = " << p.chunk_eff << ", " << ms(p.time.median_s)
      << " (+" << pct(p.time.median_s / best - 1) << "), dispatch peak "
      << format_bytes(p.peak_bytes);
  return {pick, why.str()};
}

Choice select_staging(const std::vector<OptimizerPoint>& points, double tolerance) {
  if (points.empty())
    MOEPEAK_INPUT_ERROR("tune: no (bucket_params, staging_slots) point was measured");
  if (!any_fits(points)) {
    size_t lo = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].bound_bytes < points[lo].bound_bytes) lo = i;
    }
    const OptimizerPoint& p = points[lo];
    MOEPEAK_INPUT_ERROR("tune: no (bucket_params, staging_slots) of the ", points.size(),
                        " measured fits the plan: the smallest optimizer staging ",
                        format_bytes(p.bound_bytes), " (beta = ", p.bucket_params,
                        ", s = ", p.staging_slots, ") ", p.plan_note);
  }
  const double best = best_fitting(points);
  size_t pick = points.size();
  for (size_t i = 0; i < points.size(); ++i) {
    const OptimizerPoint& p = points[i];
    if (!p.plan_fits || p.time.median_s > best * (1 + tolerance)) continue;
    if (pick == points.size()) {
      pick = i;
      continue;
    }
    const OptimizerPoint& q = points[pick];
    if (p.bound_bytes < q.bound_bytes || (p.bound_bytes == q.bound_bytes && p.slots < q.slots) ||
        (p.bound_bytes == q.bound_bytes && p.slots == q.slots &&
         p.bucket_params < q.bucket_params)) {
      pick = i;
    }
  }
  const OptimizerPoint& p = points[pick];
  std::ostringstream why;
  why << "smallest staging within " << pct(tolerance) << " of the fastest point the plan accepts ("
      << ms(best) << "): beta = " << p.bucket_params << ", s = " << p.staging_slots
      << " -> staging " << format_bytes(p.bound_bytes) << ", " << ms(p.time.median_s) << " (+"
      << pct(p.time.median_s / best - 1) << ")";
  return {pick, why.str()};
}

Choice select_payload(const std::vector<VocabPoint>& points, const std::string& preferred) {
  // NOTES: the payloads are compared as the paper's schedule runs them, with no strips kept;
  // select_kept_strips then trades memory for time within the chosen one.
  auto unkept = [&](size_t i) { return points[i].kept_strips == 0; };
  size_t lo = points.size();
  bool fits = false;
  for (size_t i = 0; i < points.size(); ++i) {
    if (!unkept(i)) continue;
    if (lo == points.size() || points[i].bound_bytes < points[lo].bound_bytes) lo = i;
    fits = fits || points[i].plan_fits;
  }
  if (lo == points.size()) MOEPEAK_INPUT_ERROR("tune: no Ring-DTP payload was measured");
  if (!fits) {
    MOEPEAK_INPUT_ERROR("tune: no Ring-DTP payload fits the plan: the smaller logits term ",
                        format_bytes(points[lo].bound_bytes), " (", points[lo].payload, ") ",
                        points[lo].plan_note);
  }
  size_t pick = points.size();
  for (size_t i = 0; i < points.size(); ++i) {
    const VocabPoint& p = points[i];
    if (!p.plan_fits || !unkept(i)) continue;
    if (pick == points.size() || p.time.median_s < points[pick].time.median_s ||
        (p.time.median_s == points[pick].time.median_s && p.payload == preferred)) {
      pick = i;
    }
  }
  std::ostringstream why;
  why << "the faster payload the plan accepts: " << points[pick].payload << " "
      << ms(points[pick].time.median_s);
  for (size_t i = 0; i < points.size(); ++i) {
    if (i == pick || !unkept(i)) continue;
    why << " vs " << points[i].payload << " " << ms(points[i].time.median_s)
        << (points[i].plan_fits ? "" : " (does not fit)");
  }
  return {pick, why.str()};
}

Choice select_kept_strips(const std::vector<VocabPoint>& points, const std::string& payload,
                          double tolerance) {
  double best = std::numeric_limits<double>::infinity();
  for (const VocabPoint& p : points) {
    if (p.payload == payload && p.plan_fits) best = std::min(best, p.time.median_s);
  }
  if (best == std::numeric_limits<double>::infinity()) {
    MOEPEAK_INPUT_ERROR("tune: no Ring-DTP point of the ", payload, " payload fits the plan");
  }
  size_t pick = points.size();
  for (size_t i = 0; i < points.size(); ++i) {
    const VocabPoint& p = points[i];
    if (p.payload != payload || !p.plan_fits || p.time.median_s > best * (1 + tolerance)) continue;
    if (pick == points.size() || p.kept_strips < points[pick].kept_strips) pick = i;
  }
  const VocabPoint& p = points[pick];
  std::ostringstream why;
  why << "fewest kept strips within " << pct(tolerance) << " of the fastest " << payload
      << " point the plan accepts (" << ms(best) << "): " << p.kept_strips << " kept -> logits "
      << format_bytes(p.bound_bytes) << ", " << ms(p.time.median_s) << " (+"
      << pct(p.time.median_s / best - 1) << ")";
  return {pick, why.str()};
}

Choice select_sco(const std::vector<ScoPoint>& points, double tolerance) {
  if (points.empty()) MOEPEAK_INPUT_ERROR("tune: no SCO host budget was measured");
  if (!any_fits(points)) {
    size_t lo = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].bound_bytes < points[lo].bound_bytes) lo = i;
    }
    MOEPEAK_INPUT_ERROR("tune: no SCO host budget of the ", points.size(),
                        " measured fits the plan: the smallest "
                        "boundaries term ",
                        format_bytes(points[lo].bound_bytes), " (", points[lo].offloaded_layers,
                        " layers offloaded) ", points[lo].plan_note);
  }
  size_t pick = points.size();
  double least = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < points.size(); ++i) {
    const ScoPoint& p = points[i];
    if (p.plan_fits) least = std::min(least, p.overhead);
    if (!p.plan_fits || p.overhead > tolerance) continue;
    if (pick == points.size() || p.offloaded_layers > points[pick].offloaded_layers ||
        (p.offloaded_layers == points[pick].offloaded_layers &&
         p.host_budget < points[pick].host_budget)) {
      pick = i;
    }
  }
  if (pick == points.size()) {
    MOEPEAK_INPUT_ERROR(
        "tune: no SCO host budget the plan accepts keeps the overhead over standard checkpointing "
        "within ",
        pct(tolerance), ": the least is +", pct(least), " (--sco-tolerance raises the limit)");
  }
  const ScoPoint& p = points[pick];
  std::ostringstream why;
  why << "most offloaded layers with overhead within " << pct(tolerance)
      << " of standard checkpointing: " << p.offloaded_layers << " layers (" << p.label
      << ", host budget " << format_bytes(p.host_budget) << "), overhead "
      << (p.overhead >= 0 ? "+" : "") << pct(p.overhead) << ", boundaries peak "
      << format_bytes(p.peak_bytes);
  return {pick, why.str()};
}

}  // namespace moepeak::tune
