// The plan as a picture (`moepeak plan --svg FILE`): per-rank bytes of every live set, stacked,
// against the context length (x: seq_len on a log2 scale, one bar per plan), one panel per
// schedule set (e.g. all-standard and the bounded stack side by side), the device capacity as a
// horizontal line, and a legend naming the live sets. Plain SVG text, no dependencies.
//
//   std::vector<PlanSeries> s = {{"all standard", plans_std}, {"bounded", plans_bounded}};
//   std::string svg = plan_svg(s, "gpt-oss-20b on 8 x H200");   // each Plan one make_plan call
//
// Bars over the capacity are drawn up to the panel's top (1.5 x capacity) and marked "over".
// Test: ctest -R test_plan_reach (parses the SVG), test_plan_cli (the --svg option).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/plan/plan.h"

namespace moepeak {

struct PlanSeries {
  std::string name;         // the panel's title: "all standard", "bounded (configured)"
  std::vector<Plan> plans;  // increasing seq_len; an empty series draws an empty panel
};

std::string plan_svg(const std::vector<PlanSeries>& series, std::string_view title);

// The powers of two in [lo, hi] that are multiples of W (the x axis of `--svg`).
std::vector<int64_t> svg_seq_lens(int64_t lo, int64_t hi, int world);

}  // namespace moepeak
