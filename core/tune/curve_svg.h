// One measured curve of `moepeak tune` as an SVG plot (plain text, no dependencies; drawn by hand
// as core/plan/plan_svg.cpp draws the plan): axes with ticks and units, one polyline + points per
// series, optional horizontal reference lines (e.g. the host-link floor), the chosen point ringed
// in red and labelled, points the plan rejects drawn hollow.
//
//   Curve c{"dispatch: PipelinedLLEP fwd+bwd", "c_eff (tokens per source per chunk)", "ms", true};
//   c.series.push_back({"K_max = 16", {{64, 1.9, "c=64", true}, ...}});
//   c.chosen_series = 0; c.chosen_point = 2;
//   std::string svg = curve_svg(c);
//
// Elements carry classes for tests: "series" groups (data-name), "point" circles (data-x, data-y,
// class "point rejected" when the plan does not accept it), "chosen" (the mark), "reference" lines.
// Test: ctest -R test_tune_select (parses a plot).
#pragma once

#include <string>
#include <vector>

namespace moepeak::tune {

struct CurvePoint {
  double x = 0, y = 0;
  std::string label;     // shown beside the chosen point and in the point's <title>
  bool accepted = true;  // false: the plan rejects it (hollow)
};

struct CurveSeries {
  std::string name;
  std::vector<CurvePoint> points;  // drawn in the given order
};

struct ReferenceLine {
  double y = 0;
  std::string label;
};

struct Curve {
  std::string title, x_label, y_label;
  bool log_x = false;  // log2 x axis (x must be > 0)
  std::vector<CurveSeries> series;
  std::vector<ReferenceLine> references;
  int chosen_series = -1, chosen_point = -1;  // -1: nothing chosen
  std::string subtitle;                       // e.g. the rule in words
};

std::string curve_svg(const Curve& curve);

}  // namespace moepeak::tune
