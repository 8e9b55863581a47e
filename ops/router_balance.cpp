// DeepSeek-V3's correction-bias update (ops/router_balance.h): one integer comparison with the
// mean and one rounding per expert.
#include "ops/router_balance.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace moepeak::ops {
namespace {

template <typename F>
void update(std::span<const int64_t> load, double gamma, std::span<F> bias) {
  const char* op = "update_correction_bias";
  MOEPEAK_CHECK(load.size() == bias.size(), op, ": load has ", load.size(), " experts, bias ",
                bias.size());
  MOEPEAK_CHECK(std::isfinite(gamma) && gamma >= 0, op, ": gamma must be finite and >= 0, got ",
                gamma);
  const auto experts = static_cast<int64_t>(load.size());
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total = 0;
  for (size_t e = 0; e < load.size(); ++e) {
    MOEPEAK_CHECK(load[e] >= 0, op, ": load[", e, "] = ", load[e], " is negative");
    MOEPEAK_CHECK(load[e] <= kMax - total, op, ": the loads' sum overflows int64");
    total += load[e];
  }
  // E * load[e] <= E * total: in range for every e once E * total is.
  MOEPEAK_CHECK(experts == 0 || total <= kMax / experts, op, ": E * sum(load) = ", experts, " * ",
                total, " overflows int64");
  for (size_t e = 0; e < load.size(); ++e) {
    // sign(mean - load[e]) = sign(total - E * load[e]), exactly.
    const int64_t diff = total - experts * load[e];
    const double step = diff > 0 ? gamma : diff < 0 ? -gamma : 0.0;
    bias[e] = static_cast<F>(static_cast<double>(bias[e]) + step);
  }
}

}  // namespace

void update_correction_bias(std::span<const int64_t> load, double gamma, std::span<float> bias) {
  update(load, gamma, bias);
}

void update_correction_bias(std::span<const int64_t> load, double gamma, std::span<double> bias) {
  update(load, gamma, bias);
}

}  // namespace moepeak::ops
