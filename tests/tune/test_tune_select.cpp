// tune's selection rules (core/tune/select.h) on synthetic curves — flat, knee, noisy, nothing
// fits (a clear error naming the constraint) — and the curve plot (core/tune/curve_svg.h).
// Run: ctest -R test_tune_select
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tune/curve_svg.h"
#include "core/tune/select.h"

namespace moepeak::tune {
namespace {

// A dispatch curve over c_eff = 64 .. 1024 (N = 1024, K_max = 16): peak grows with c_eff.
std::vector<DispatchPoint> dispatch_curve(const std::vector<double>& times_ms) {
  std::vector<DispatchPoint> pts;
  int64_t c = 64;
  for (double t : times_ms) {
    DispatchPoint p;
    p.chunk_tokens = c;
    p.max_chunks = 16;
    p.chunk_eff = c;
    p.chunks = 1024 / c;
    p.time = summarize({t / 1e3});
    p.peak_bytes = p.bound_bytes = static_cast<uint64_t>(c) * 4096;
    p.plan_fits = true;
    pts.push_back(p);
    c *= 2;
  }
  return pts;
}

std::vector<OptimizerPoint> optimizer_curve(const std::vector<double>& times_ms) {
  // beta = 2^14 .. for s = 2: staging 2 * 3 * beta * 4 bytes.
  std::vector<OptimizerPoint> pts;
  int64_t beta = 16384;
  for (double t : times_ms) {
    OptimizerPoint p;
    p.bucket_params = p.bucket = beta;
    p.staging_slots = p.slots = 2;
    p.time = summarize({t / 1e3});
    p.staging_bytes = p.bound_bytes = static_cast<uint64_t>(2 * 3 * 4 * beta);
    p.plan_fits = true;
    pts.push_back(p);
    beta *= 2;
  }
  return pts;
}

TEST(TuneSummarize, MedianMinMax) {
  const Timing t = summarize({3.0, 1.0, 2.0, 10.0});
  EXPECT_DOUBLE_EQ(t.median_s, 2.5);  // the mean of the two middle values
  EXPECT_DOUBLE_EQ(t.min_s, 1.0);
  EXPECT_DOUBLE_EQ(t.max_s, 10.0);
  EXPECT_EQ(t.repeats, 4);
  EXPECT_DOUBLE_EQ(summarize({5.0, 1.0, 2.0}).median_s, 2.0);
  EXPECT_THROW(summarize({}), Error);
}

TEST(TuneSelectChunk, FlatCurvePicksTheSmallestChunk) {
  const auto pts = dispatch_curve({10.0, 10.1, 10.0, 9.95, 10.02});
  const Choice c = select_chunk(pts, 0.03);
  EXPECT_EQ(c.index, 0u);
  EXPECT_NE(c.reason.find("c = 64"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("3.0%"), std::string::npos) << c.reason;
}

TEST(TuneSelectChunk, KneePicksTheFirstPointPastTheKnee) {
  // Small chunks pay per-chunk overheads; from c_eff = 256 on the time is flat.
  const auto pts = dispatch_curve({20.0, 14.0, 10.2, 10.0, 10.1});
  EXPECT_EQ(select_chunk(pts, 0.03).index, 2u);
  // A tighter tolerance excludes 10.2 (2% over 10.0).
  EXPECT_EQ(select_chunk(pts, 0.01).index, 3u);
}

TEST(TuneSelectChunk, NoisyCurveUsesTheMedians) {
  // Each point: 5 repetitions around a knee curve with outliers; the medians decide.
  const std::vector<double> truth = {20.0, 14.0, 10.2, 10.0, 10.1};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(-0.001, 0.001);
  auto pts = dispatch_curve(truth);
  for (size_t i = 0; i < pts.size(); ++i) {
    std::vector<double> reps;
    for (int r = 0; r < 5; ++r) reps.push_back(truth[i] / 1e3 * (1 + jitter(rng)));
    reps[static_cast<size_t>(i % 5)] = 1.0;  // one outlier a second long in every point
    pts[i].time = summarize(reps);
  }
  EXPECT_EQ(select_chunk(pts, 0.03).index, 2u);
}

TEST(TuneSelectChunk, OnlyPointsThePlanAcceptsCount) {
  auto pts = dispatch_curve({20.0, 14.0, 10.2, 10.0, 10.1});
  pts[3].plan_fits = pts[4].plan_fits = false;  // the fastest are rejected
  // The fastest accepted is 10.2 (c_eff 256); 14.0 is 37% over it.
  EXPECT_EQ(select_chunk(pts, 0.03).index, 2u);
  pts = dispatch_curve({10.0, 10.0, 10.0});
  pts[0].plan_fits = false;
  EXPECT_EQ(select_chunk(pts, 0.03).index, 1u);
}

TEST(TuneSelectChunk, NothingFitsNamesTheConstraint) {
  auto pts = dispatch_curve({10.0, 9.0, 8.0});
  for (auto& p : pts) {
    p.plan_fits = false;
    p.plan_note = "does not fit: device total 3.00 MiB > capacity 1.00 MiB";
  }
  try {
    select_chunk(pts, 0.03);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no chunk_tokens in {64, 128, 256} fits the plan"), std::string::npos) << m;
    EXPECT_NE(m.find("the smallest dispatch peak 256.00 KiB (c = 64, K_max = 16)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("capacity 1.00 MiB"), std::string::npos) << m;
  }
  EXPECT_THROW(select_chunk({}, 0.03), Error);
}

TEST(TuneSelectStaging, FlatKneeNoisyAndNothingFits) {
  // Flat: the smallest staging.
  EXPECT_EQ(select_staging(optimizer_curve({5.0, 5.1, 5.0, 4.9}), 0.05).index, 0u);
  // Knee: small buckets pay per-bucket overheads until 65536.
  EXPECT_EQ(select_staging(optimizer_curve({9.0, 7.0, 5.2, 5.0, 5.0}), 0.05).index, 2u);
  // Equal staging from different (beta, s): fewer slots wins.
  auto pts = optimizer_curve({5.0, 5.0});
  pts[1].bucket_params = pts[1].bucket = 21846;  // 3 slots of ~2/3 the bucket: about equal bytes
  pts[1].staging_slots = pts[1].slots = 3;
  pts[1].bound_bytes = pts[0].bound_bytes;
  EXPECT_EQ(select_staging(pts, 0.05).index, 0u);
  // Noisy medians.
  pts = optimizer_curve({9.0, 7.0, 5.2, 5.0});
  pts[0].time = summarize({0.009, 0.0001, 0.009});  // a fast outlier does not move the median
  EXPECT_EQ(select_staging(pts, 0.05).index, 2u);
  // Nothing fits: the error names the smallest staging and the plan's reason.
  for (auto& p : pts) {
    p.plan_fits = false;
    p.plan_note = "does not fit: host total 2 GiB > budget 1 GiB";
  }
  try {
    select_staging(pts, 0.05);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find("fits the plan: the smallest optimizer staging 384.00 KiB (beta = 16384, s = 2)"),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("budget 1 GiB"), std::string::npos) << m;
  }
}

// Payloads are compared on their points with no strips kept; then, within the chosen payload, the
// fewest kept strips within the tolerance of its fastest accepted point.
TEST(TuneSelectKeptStrips, PayloadOnUnkeptPointsThenFewestKeptWithinTolerance) {
  std::vector<VocabPoint> pts(6);
  const double times[6] = {0.0100, 0.0090, 0.0080, 0.0110, 0.0070, 0.0060};
  const int64_t kept[6] = {0, 2, 4, 0, 2, 4};
  for (size_t i = 0; i < pts.size(); ++i) {
    pts[i].payload = i < 3 ? "activations" : "weights";
    pts[i].kept_strips = kept[i];
    pts[i].time = summarize({times[i]});
    pts[i].bound_bytes = 1000 + 100 * static_cast<uint64_t>(kept[i]);
    pts[i].plan_fits = true;
  }
  // activations is faster with none kept (10 ms vs 11 ms), although weights with kept strips is
  // the fastest point overall.
  EXPECT_EQ(select_payload(pts, "weights").index, 0u);
  // Within activations: fastest 8 ms (4 kept); 3% admits only it; 15% admits 2 kept (9 ms).
  EXPECT_EQ(select_kept_strips(pts, "activations", 0.03).index, 2u);
  EXPECT_EQ(select_kept_strips(pts, "activations", 0.15).index, 1u);
  EXPECT_EQ(select_kept_strips(pts, "activations", 0.30).index, 0u);
  const Choice c = select_kept_strips(pts, "activations", 0.03);
  EXPECT_NE(c.reason.find("4 kept"), std::string::npos) << c.reason;
  // A point the plan rejects is never chosen, however fast.
  pts[2].plan_fits = false;
  EXPECT_EQ(select_kept_strips(pts, "activations", 0.03).index, 1u);
  pts[0].plan_fits = pts[1].plan_fits = false;
  EXPECT_THROW(select_kept_strips(pts, "activations", 0.03), Error);
  // Without an unkept point that fits, no payload is chosen.
  pts[3].plan_fits = false;
  EXPECT_THROW(select_payload(pts, ""), Error);
}

TEST(TuneSelectPayload, TheFasterPayloadThePlanAccepts) {
  std::vector<VocabPoint> pts(2);
  pts[0].payload = "activations";
  pts[1].payload = "weights";
  pts[0].time = summarize({0.010});
  pts[1].time = summarize({0.008});
  pts[0].plan_fits = pts[1].plan_fits = true;
  EXPECT_EQ(select_payload(pts, "activations").index, 1u);
  pts[1].time = summarize({0.010});  // a tie: the preferred one
  EXPECT_EQ(select_payload(pts, "weights").index, 1u);
  EXPECT_EQ(select_payload(pts, "activations").index, 0u);
  pts[1].time = summarize({0.001});
  pts[1].plan_fits = false;  // faster but rejected
  EXPECT_EQ(select_payload(pts, "").index, 0u);
  pts[0].plan_fits = false;
  pts[0].plan_note = pts[1].plan_note = "does not fit: device total";
  EXPECT_THROW(
      {
        try {
          select_payload(pts, "");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("no Ring-DTP payload fits the plan"),
                    std::string::npos);
          throw;
        }
      },
      Error);
}

TEST(TuneSelectSco, MostOffloadWithinTheOverheadLimit) {
  std::vector<ScoPoint> pts(3);
  const char* labels[] = {"none", "half", "all"};
  for (int i = 0; i < 3; ++i) {
    pts[i].label = labels[i];
    pts[i].offloaded_layers = 2 * i;
    pts[i].host_budget = 1000u * static_cast<uint64_t>(i);
    pts[i].bound_bytes = 100u * static_cast<uint64_t>(5 - i);
    pts[i].plan_fits = true;
  }
  pts[0].overhead = 0.001;
  pts[1].overhead = 0.02;
  pts[2].overhead = 0.10;  // offloading every layer costs 10%
  EXPECT_EQ(select_sco(pts, 0.03).index, 1u);
  EXPECT_EQ(select_sco(pts, 0.20).index, 2u);  // flat enough: all of them
  pts[2].overhead = -0.01;                     // noise: faster than standard
  EXPECT_EQ(select_sco(pts, 0.03).index, 2u);
  pts[2].plan_fits = false;  // the host budget cannot hold every layer
  EXPECT_EQ(select_sco(pts, 0.03).index, 1u);
  // Over the limit everywhere: the error names the limit and the least overhead.
  for (auto& p : pts) p.overhead = 0.5;
  try {
    select_sco(pts, 0.03);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("within 3.0%: the least is +50.0%"), std::string::npos) << m;
  }
  for (auto& p : pts) p.plan_fits = false;
  EXPECT_THROW(select_sco(pts, 0.03), Error);
}

TEST(TuneCurveSvg, PointsChosenMarkAndReferences) {
  Curve c{"optimizer & co", "staging (MiB)", "ms", true, {}, {}, -1, -1, "rule <5%>"};
  c.series.push_back({"s = 2", {{1, 5.0, "a", true}, {2, 4.0, "b", true}, {4, 4.1, "c", false}}});
  c.series.push_back({"s = 3", {{1.5, 4.5, "d", true}}});
  c.references.push_back({1.0, "floor"});
  c.chosen_series = 0;
  c.chosen_point = 1;
  const std::string svg = curve_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("optimizer &amp; co"), std::string::npos);
  EXPECT_NE(svg.find("rule &lt;5%&gt;"), std::string::npos);
  size_t points = 0;
  for (size_t at = svg.find("class=\"point"); at != std::string::npos;
       at = svg.find("class=\"point", at + 1)) {
    ++points;
  }
  EXPECT_EQ(points, 4u);
  EXPECT_NE(svg.find("class=\"point rejected\""), std::string::npos);
  EXPECT_NE(svg.find("class=\"chosen\" data-x=\"2\" data-y=\"4\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("class=\"reference\""), std::string::npos);
  EXPECT_NE(svg.find("(log2 scale)"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace moepeak::tune
