// curve_svg: one tune curve as SVG text (curve_svg.h). Test: ctest -R test_tune_select
#include "core/tune/curve_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string_view>

namespace moepeak::tune {
namespace {

constexpr const char* kColours[] = {"#4e79a7", "#f28e2b", "#59a14f",
                                    "#b07aa1", "#9c755f", "#e15759"};
constexpr double kW = 680, kH = 420, kLeft = 80, kRight = 20, kTop = 70, kBottom = 70;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::isfinite(v) ? v : 0.0);
  return buf;
}

std::string tick(double v) {
  char buf[32];
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-2)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
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

}  // namespace

std::string curve_svg(const Curve& c) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymax = 0;
  for (const CurveSeries& s : c.series) {
    for (const CurvePoint& p : s.points) {
      const double x = c.log_x ? std::log2(std::max(p.x, 1e-300)) : p.x;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, p.y);
    }
  }
  for (const ReferenceLine& r : c.references) ymax = std::max(ymax, r.y);
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (xmax - xmin < 1e-12) xmin -= 0.5, xmax += 0.5;
  const double pad = 0.05 * (xmax - xmin);
  xmin -= pad;
  xmax += pad;
  ymax = ymax > 0 ? ymax * 1.15 : 1.0;  // y from 0: times and overheads read against zero
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double x) {
    const double v = c.log_x ? std::log2(std::max(x, 1e-300)) : x;
    return kLeft + (v - xmin) / (xmax - xmin) * pw;
  };
  auto Y = [&](double y) { return kTop + ph - std::clamp(y, 0.0, ymax) / ymax * ph; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kW) << "\" height=\"" << num(kH)
    << "\" viewBox=\"0 0 " << num(kW) << " " << num(kH)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<title>" << escape(c.title) << "</title>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << num(kW) << "\" height=\"" << num(kH)
    << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << num(kW / 2) << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << escape(c.title) << "</text>\n";
  // The subtitle (the rule and its numbers) wrapped at spaces into lines of at most ~115 chars.
  std::vector<std::string> lines(1);
  for (size_t at = 0; at < c.subtitle.size();) {
    size_t end = c.subtitle.find(' ', at);
    if (end == std::string::npos) end = c.subtitle.size();
    const std::string word = c.subtitle.substr(at, end - at);
    if (!lines.back().empty() && lines.back().size() + 1 + word.size() > 115) lines.emplace_back();
    lines.back() += (lines.back().empty() ? "" : " ") + word;
    at = end + 1;
  }
  for (size_t i = 0; i < lines.size() && i < 3 && !lines[i].empty(); ++i) {
    o << "<text class=\"subtitle\" x=\"" << num(kW / 2) << "\" y=\""
      << num(34 + 11 * static_cast<double>(i))
      << "\" text-anchor=\"middle\" font-size=\"9\" fill=\"#444\">" << escape(lines[i])
      << "</text>\n";
  }
  o << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(kTop) << "\" width=\"" << num(pw)
    << "\" height=\"" << num(ph) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  // y ticks: fifths of the range.
  for (int q = 0; q <= 5; ++q) {
    const double y = ymax * q / 5.0;
    o << "<line x1=\"" << num(kLeft - 4) << "\" x2=\"" << num(kLeft) << "\" y1=\"" << num(Y(y))
      << "\" y2=\"" << num(Y(y)) << "\" stroke=\"#888\"/><text x=\"" << num(kLeft - 6) << "\" y=\""
      << num(Y(y) + 4) << "\" text-anchor=\"end\">" << tick(y) << "</text>\n";
  }
  // x ticks: at the measured x values (distinct), so every tick is a measured point.
  std::vector<double> xs;
  for (const CurveSeries& s : c.series) {
    for (const CurvePoint& p : s.points) xs.push_back(p.x);
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  double last_x = -1e9;
  for (double x : xs) {
    if (X(x) - last_x < 36) continue;  // keep labels apart
    last_x = X(x);
    o << "<line x1=\"" << num(X(x)) << "\" x2=\"" << num(X(x)) << "\" y1=\"" << num(kTop + ph)
      << "\" y2=\"" << num(kTop + ph + 4) << "\" stroke=\"#888\"/><text x=\"" << num(X(x))
      << "\" y=\"" << num(kTop + ph + 16) << "\" text-anchor=\"middle\">" << tick(x) << "</text>\n";
  }
  o << "<text x=\"" << num(kLeft + pw / 2) << "\" y=\"" << num(kH - 36)
    << "\" text-anchor=\"middle\">" << escape(c.x_label) << (c.log_x ? " (log2 scale)" : "")
    << "</text>\n";
  o << "<text x=\"16\" y=\"" << num(kTop + ph / 2) << "\" transform=\"rotate(-90 16 "
    << num(kTop + ph / 2) << ")\" text-anchor=\"middle\">" << escape(c.y_label) << "</text>\n";
  for (size_t ri = 0; ri < c.references.size();
       ++ri) {  // labels at the left, alternately below and above
    const ReferenceLine& r = c.references[ri];
    const bool odd = ri % 2 == 1;
    o << "<line class=\"reference\" x1=\"" << num(kLeft) << "\" x2=\"" << num(kLeft + pw)
      << "\" y1=\"" << num(Y(r.y)) << "\" y2=\"" << num(Y(r.y))
      << "\" stroke=\"#c00\" stroke-dasharray=\"6 3\"/><text x=\"" << num(kLeft + 110) << "\" y=\""
      << num(odd ? Y(r.y) - 4 : Y(r.y) + 12) << "\" text-anchor=\"start\" fill=\"#c00\">"
      << escape(r.label) << "</text>\n";
  }
  for (size_t si = 0; si < c.series.size(); ++si) {
    const CurveSeries& s = c.series[si];
    const char* colour = kColours[si % (sizeof kColours / sizeof kColours[0])];
    o << "<g class=\"series\" data-name=\"" << escape(s.name) << "\" stroke=\"" << colour
      << "\" fill=\"" << colour << "\">\n";
    if (s.points.size() > 1) {  // the line joins the points in x order
      std::vector<CurvePoint> sorted = s.points;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const CurvePoint& a, const CurvePoint& b) { return a.x < b.x; });
      o << "<polyline fill=\"none\" stroke-width=\"1.5\" points=\"";
      for (size_t k = 0; k < sorted.size(); ++k) {
        o << (k ? " " : "") << num(X(sorted[k].x)) << "," << num(Y(sorted[k].y));
      }
      o << "\"/>\n";
    }
    for (const CurvePoint& p : s.points) {
      o << "<circle class=\"point" << (p.accepted ? "" : " rejected") << "\" cx=\"" << num(X(p.x))
        << "\" cy=\"" << num(Y(p.y)) << "\" r=\"3.5\" data-x=\"" << p.x << "\" data-y=\"" << p.y
        << "\"" << (p.accepted ? "" : " fill=\"white\"") << "><title>" << escape(p.label)
        << (p.accepted ? "" : " (the plan rejects it)") << "</title></circle>\n";
    }
    o << "</g>\n";
    // Legend entry.
    const double ly = kTop + 12 + 14 * static_cast<double>(si);
    o << "<rect x=\"" << num(kLeft + 8) << "\" y=\"" << num(ly - 9)
      << "\" width=\"10\" height=\"10\" fill=\"" << colour << "\"/><text x=\"" << num(kLeft + 22)
      << "\" y=\"" << num(ly) << "\">" << escape(s.name) << "</text>\n";
  }
  if (c.chosen_series >= 0 && static_cast<size_t>(c.chosen_series) < c.series.size()) {
    const CurveSeries& s = c.series[static_cast<size_t>(c.chosen_series)];
    if (c.chosen_point >= 0 && static_cast<size_t>(c.chosen_point) < s.points.size()) {
      const CurvePoint& p = s.points[static_cast<size_t>(c.chosen_point)];
      o << "<g class=\"chosen\" data-x=\"" << p.x << "\" data-y=\"" << p.y << "\"><circle cx=\""
        << num(X(p.x)) << "\" cy=\"" << num(Y(p.y))
        << "\" r=\"8\" fill=\"none\" stroke=\"#c00\" stroke-width=\"2\"/><text x=\"" << num(X(p.x))
        << "\" y=\"" << num(Y(p.y) - 12) << "\" text-anchor=\""
        << (X(p.x) > kLeft + 0.75 * pw   ? "end"
            : X(p.x) < kLeft + 0.25 * pw ? "start"
                                         : "middle")
        << "\" fill=\"#c00\">chosen: " << escape(p.label) << "</text></g>\n";
    }
  }
  o << "<text x=\"" << num(kLeft) << "\" y=\"" << num(kH - 12)
    << "\" font-size=\"10\" fill=\"#444\">hollow: the plan "
       "rejects the point; ringed: the chosen point</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace moepeak::tune
