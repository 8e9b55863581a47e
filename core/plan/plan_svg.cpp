// plan_svg: the stacked per-live-set budget against context length as SVG text (plan_svg.h).
// Test: ctest -R test_plan_reach
#include "core/plan/plan_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/units.h"

namespace moepeak {
namespace {

// One colour per live set, kAllLiveSets order (weights .. workspace).
constexpr const char* kColours[kNumLiveSets] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#e15759",
                                                "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
constexpr double kPanelW = 420, kPanelH = 300, kLeft = 70, kTop = 50, kGap = 40, kLegendH = 60;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::isfinite(v) ? v : 0.0);
  return buf;
}

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string tokens_label(int64_t t) {
  if (t >= (int64_t{1} << 20) && t % (int64_t{1} << 20) == 0) return std::to_string(t >> 20) + "M";
  if (t >= 1024 && t % 1024 == 0) return std::to_string(t >> 10) + "K";
  return std::to_string(t);
}

}  // namespace

std::vector<int64_t> svg_seq_lens(int64_t lo, int64_t hi, int world) {
  std::vector<int64_t> out;
  for (int64_t t = 1; t <= hi && t > 0; t *= 2) {
    if (t >= lo && t % std::max(world, 1) == 0) out.push_back(t);
  }
  return out;
}

std::string plan_svg(const std::vector<PlanSeries>& series, std::string_view title) {
  const size_t panels = std::max<size_t>(series.size(), 1);
  const double width = kLeft + static_cast<double>(panels) * (kPanelW + kGap) + 10;
  const double height = kTop + kPanelH + 50 + kLegendH;
  uint64_t capacity = 0;
  int64_t tmin = 0, tmax = 0;
  for (const PlanSeries& s : series) {
    for (const Plan& p : s.plans) {
      capacity = std::max(capacity, p.inputs.capacity);
      tmin = tmin == 0 ? p.inputs.seq_len : std::min(tmin, p.inputs.seq_len);
      tmax = std::max(tmax, p.inputs.seq_len);
    }
  }
  const double ymax = capacity > 0 ? 1.5 * static_cast<double>(capacity) : 1.0;
  const double lx0 = std::log2(static_cast<double>(std::max<int64_t>(tmin, 1)));
  const double lx1 = std::log2(static_cast<double>(std::max<int64_t>(tmax, 1)));
  const double slots = lx1 - lx0 + 1;  // one slot per power of two
  const double slot_w = kPanelW / slots, bar_w = slot_w * 0.7;

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(width) << " " << num(height)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<title>" << escape(title) << "</title>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << num(width) << "\" height=\"" << num(height)
    << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << num(width / 2) << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << escape(title) << "</text>\n";
  auto y_of = [&](double bytes) { return kTop + kPanelH - std::min(bytes, ymax) / ymax * kPanelH; };

  for (size_t pi = 0; pi < series.size(); ++pi) {
    const PlanSeries& s = series[pi];
    const double x0 = kLeft + static_cast<double>(pi) * (kPanelW + kGap);
    o << "<g class=\"panel\" data-name=\"" << escape(s.name) << "\">\n";
    o << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"" << num(kTop - 8)
      << "\" text-anchor=\"middle\">" << escape(s.name) << "</text>\n";
    o << "<rect x=\"" << num(x0) << "\" y=\"" << num(kTop) << "\" width=\"" << num(kPanelW)
      << "\" height=\"" << num(kPanelH) << "\" fill=\"none\" stroke=\"#888\"/>\n";
    // y ticks: quarters of the capacity, in GiB.
    for (int q = 0; q <= 6; ++q) {
      const double b = static_cast<double>(capacity) * q / 4.0;
      o << "<text x=\"" << num(x0 - 4) << "\" y=\"" << num(y_of(b) + 4) << "\" text-anchor=\"end\">"
        << num(b / static_cast<double>(GiB)) << "</text>\n";
    }
    // One group per live set: a rect per plan, stacked in kAllLiveSets order.
    std::vector<double> base(s.plans.size(), 0.0);
    for (size_t li = 0; li < kNumLiveSets; ++li) {
      const LiveSet ls = kAllLiveSets[li];
      o << "<g class=\"set\" data-set=\"" << live_set_name(ls) << "\" fill=\"" << kColours[li]
        << "\">\n";
      for (size_t k = 0; k < s.plans.size(); ++k) {
        const Plan& p = s.plans[k];
        const double bytes = static_cast<double>(p.term(ls).bytes);
        const double slot = std::log2(static_cast<double>(p.inputs.seq_len)) - lx0;
        const double x = x0 + slot * slot_w + (slot_w - bar_w) / 2;
        const double ylo = y_of(base[k]), yhi = y_of(base[k] + bytes);
        o << "<rect x=\"" << num(x) << "\" y=\"" << num(yhi) << "\" width=\"" << num(bar_w)
          << "\" height=\"" << num(ylo - yhi) << "\" data-bytes=\"" << p.term(ls).bytes << "\"/>\n";
        base[k] += bytes;
      }
      o << "</g>\n";
    }
    // x labels and the overflow marks.
    for (size_t k = 0; k < s.plans.size(); ++k) {
      const Plan& p = s.plans[k];
      const double slot = std::log2(static_cast<double>(p.inputs.seq_len)) - lx0;
      const double xc = x0 + slot * slot_w + slot_w / 2;
      o << "<text x=\"" << num(xc) << "\" y=\"" << num(kTop + kPanelH + 14)
        << "\" text-anchor=\"middle\">" << tokens_label(p.inputs.seq_len) << "</text>\n";
      if (!p.device_fits) {
        o << "<text class=\"over\" x=\"" << num(xc) << "\" y=\"" << num(kTop + 12)
          << "\" text-anchor=\"middle\" fill=\"#c00\">over</text>\n";
      }
    }
    o << "<line class=\"capacity\" x1=\"" << num(x0) << "\" x2=\"" << num(x0 + kPanelW)
      << "\" y1=\"" << num(y_of(static_cast<double>(capacity))) << "\" y2=\""
      << num(y_of(static_cast<double>(capacity)))
      << "\" stroke=\"#c00\" stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n";
    o << "<text x=\"" << num(x0 + kPanelW - 4) << "\" y=\""
      << num(y_of(static_cast<double>(capacity)) - 4)
      << "\" text-anchor=\"end\" fill=\"#c00\">capacity " << escape(format_bytes(capacity))
      << "</text>\n";
    o << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"" << num(kTop + kPanelH + 30)
      << "\" text-anchor=\"middle\">seq_len (log2)</text>\n";
    o << "</g>\n";
  }
  o << "<text x=\"14\" y=\"" << num(kTop + kPanelH / 2) << "\" transform=\"rotate(-90 14 "
    << num(kTop + kPanelH / 2) << ")\" text-anchor=\"middle\">GiB per rank</text>\n";
  // Legend.
  o << "<g class=\"legend\">\n";
  const double ly = kTop + kPanelH + 50;
  for (size_t li = 0; li < kNumLiveSets; ++li) {
    const double lx = kLeft + static_cast<double>(li % 4) * 110,
                 yy = ly + static_cast<double>(li / 4) * 18;
    o << "<rect x=\"" << num(lx) << "\" y=\"" << num(yy) << "\" width=\"12\" height=\"12\" fill=\""
      << kColours[li] << "\"/><text x=\"" << num(lx + 16) << "\" y=\"" << num(yy + 10) << "\">"
      << live_set_name(kAllLiveSets[li]) << "</text>\n";
  }
  o << "</g>\n</svg>\n";
  return o.str();
}

}  // namespace moepeak
