// Finite-difference gradient checks in float64 for op tests.
//
// For an op y = f(x1, x2, ...), tests form the scalar L = sum(y * probe) with a fixed random
// probe, run the op's backward with dy = probe, and compare each analytic dL/dx[i] with the
// central difference (L(x + h e_i) - L(x - h e_i)) / 2h. In float64 with h = 1e-6 the two agree to
// ~1e-8 relative for smooth ops; tests assert max_rel_err < 1e-6.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace moepeak::testing {

inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// |a - b| / max(|a|, |b|, floor): relative error that stays meaningful near zero.
inline double rel_err(double a, double b, double floor = 1e-8) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), floor});
}

// Max relative error between `analytic` (dL/dx) and central differences of `loss` over x.
// `loss` reads x (which this function perturbs in place and restores).
inline double max_grad_rel_err(std::vector<double>& x, const std::vector<double>& analytic,
                               const std::function<double()>& loss, double h = 1e-6) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double up = loss();
    x[i] = saved - h;
    double down = loss();
    x[i] = saved;
    worst = std::max(worst, rel_err(analytic[i], (up - down) / (2 * h), 1e-7));
  }
  return worst;
}

}  // namespace moepeak::testing
