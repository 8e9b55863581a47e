// The float64 reference of the MoE experts the dispatch schedules compute (ops/schedules/
// dispatch.h), written out on the host with no moepeak op: for token n and its k experts e_j with
// routing weights w_j, with expert e's weights w1, w3 (F, H), w2 (H, F) and, when it has them,
// biases b1, b3 (F), b2 (H):
//   a = x w1^T + b1, b = x w3^T + b3, h = act(a, b), y_e = h w2^T + b2
//   out[n] = out0[n] + sum_j w_j y_{e_j}
// act is ops::SwigluParams' (ops/swiglu.h): g = min(a, limit), u = clamp(b, -limit, limit),
// s = sigmoid(alpha g), h = (u + up_offset) g s (the plain SwiGLU at the defaults); its gradient
// passes where a <= limit (da) and -limit <= b <= limit (db), PyTorch's inclusive clamp masks.
// Backward from dout: dweight[n, j] = dout[n] . y_{e_j} (b2 included), dy = w_j dout[n];
// db2 += dy, dw2 += dy^T h, dh = dy w2, (da, db) = act'(a, b, dh), db1 += da, db3 += db,
// dw1 += da^T x, dw3 += db^T x, dx[n] = dx0[n] + sum_j (da w1 + db w3). Every sum in double, in
// token order.
//
// Used by tests/parallel/test_expert_parallel.cpp, tests/parallel/llep_testing.h and
// tests/ops/backend_ops/schedules_check.cpp against the standard dispatchers (f64, f32, and on
// the backend under test): the schedules' own arithmetic is held to this, not only to each other.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/swiglu.h"

namespace moepeak::test_support {

struct MoeReference {
  std::vector<double> out, dx, dweight;  // (N, H), (N, H), (N, k)
  // Per expert: dw1, dw3, dw2 and (with biases) db1, db3, db2, concatenated, from their starting
  // values (the tests' layout of an expert's gradients).
  std::vector<std::vector<double>> grads;
  // The routed (row, column) elements whose a was clamped (a > limit) and whose b was (|b| >
  // limit), as fractions of all: how much of the clamp a case exercises.
  double a_clamped = 0, b_clamped = 0;
};

// P: a test's problem with x, weight, dout, out0, dx0 (row-major doubles), index (N, k), per
// expert w1, w3, w2, dw1, dw3, dw2 and, when `biases`, b1, b3, b2, db1, db3, db2 (starting
// gradient values). Tokens [0, N) of it.
template <typename P>
MoeReference moe_reference(const P& p, int64_t tokens, int64_t hidden, int64_t ffn, int64_t top_k,
                           bool biases, const ops::SwigluParams& act) {
  const int64_t N = tokens, H = hidden, F = ffn, k = top_k;
  MoeReference r;
  r.out = p.out0;
  r.dx = p.dx0;
  r.out.resize(static_cast<size_t>(N * H));
  r.dx.resize(static_cast<size_t>(N * H));
  r.dweight.assign(static_cast<size_t>(N * k), 0.0);
  const size_t E = p.w1.size();
  std::vector<std::vector<double>> dw1 = p.dw1, dw3 = p.dw3, dw2 = p.dw2;
  std::vector<std::vector<double>> db1(E), db3(E), db2(E);
  if (biases) {
    db1 = p.db1;
    db3 = p.db3;
    db2 = p.db2;
  }
  std::vector<double> a(F), b(F), h(F), dy(H), da(F), db(F);
  int64_t a_clamped = 0, b_clamped = 0, elements = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double* x = &p.x[n * H];
    const double* dout = &p.dout[n * H];
    for (int64_t j = 0; j < k; ++j) {
      const size_t e = static_cast<size_t>(p.index[n * k + j]);
      const double w = p.weight[n * k + j];
      const std::vector<double>&w1 = p.w1[e], &w3 = p.w3[e], &w2 = p.w2[e];
      for (int64_t f = 0; f < F; ++f) {
        double sa = biases ? p.b1[e][f] : 0.0, sb = biases ? p.b3[e][f] : 0.0;
        for (int64_t c = 0; c < H; ++c) {
          sa += x[c] * w1[f * H + c];
          sb += x[c] * w3[f * H + c];
        }
        a[f] = sa;
        b[f] = sb;
        const double g = std::min(sa, act.limit), u = std::clamp(sb, -act.limit, act.limit);
        const double s = 1.0 / (1.0 + std::exp(-act.alpha * g));
        h[f] = (u + act.up_offset) * g * s;
        a_clamped += sa > act.limit;
        b_clamped += std::abs(sb) > act.limit;
        ++elements;
      }
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) {
        double y = biases ? p.b2[e][c] : 0.0;
        for (int64_t f = 0; f < F; ++f) y += h[f] * w2[c * F + f];
        r.out[n * H + c] += w * y;
        dot += dout[c] * y;
        dy[c] = w * dout[c];
      }
      r.dweight[n * k + j] = dot;
      for (int64_t f = 0; f < F; ++f) {
        double dh = 0;
        for (int64_t c = 0; c < H; ++c) {
          dh += dy[c] * w2[c * F + f];
          dw2[e][c * F + f] += dy[c] * h[f];
        }
        const double g = std::min(a[f], act.limit), u = std::clamp(b[f], -act.limit, act.limit);
        const double s = 1.0 / (1.0 + std::exp(-act.alpha * g));
        da[f] = a[f] <= act.limit ? dh * (u + act.up_offset) * (s + act.alpha * g * s * (1.0 - s))
                                  : 0.0;
        db[f] = std::abs(b[f]) <= act.limit ? dh * g * s : 0.0;
      }
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t c = 0; c < H; ++c) {
          dw1[e][f * H + c] += da[f] * x[c];
          dw3[e][f * H + c] += db[f] * x[c];
          r.dx[n * H + c] += da[f] * w1[f * H + c] + db[f] * w3[f * H + c];
        }
      }
      if (biases) {
        for (int64_t f = 0; f < F; ++f) {
          db1[e][f] += da[f];
          db3[e][f] += db[f];
        }
        for (int64_t c = 0; c < H; ++c) db2[e][c] += dy[c];
      }
    }
  }
  for (size_t e = 0; e < E; ++e) {
    std::vector<double> all = dw1[e];
    for (const std::vector<double>* part : {&dw3[e], &dw2[e], &db1[e], &db3[e], &db2[e]}) {
      all.insert(all.end(), part->begin(), part->end());
    }
    r.grads.push_back(std::move(all));
  }
  r.a_clamped = elements ? static_cast<double>(a_clamped) / static_cast<double>(elements) : 0.0;
  r.b_clamped = elements ? static_cast<double>(b_clamped) / static_cast<double>(elements) : 0.0;
  return r;
}

}  // namespace moepeak::test_support
