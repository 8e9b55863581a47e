// CPU cross-entropy over vocabulary strips: per token, the strip's max and exponential sum in
// double folded into a running (m, z, t) state, states merged, and the strip's gradient from the
// final state (see ops/cross_entropy_strip.h). Strips f32, bf16 or f64 (ops/cpu/cpu_storage.h):
// a bf16 logit is read exactly into double, the state is double for all three, and a gradient is
// rounded from double as the f32 path rounds it, then once more to bf16 (store(), as CUDA's
// store_from). Test: ctest -R test_ring_dtp_ops
#include "ops/cross_entropy_strip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cross_entropy.h"

namespace moepeak::ops {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

void check_state(const char* op, const Tensor& state, int64_t tokens, const char* what) {
  state.expect(Shape{tokens, 3}, DType::f64, std::string(op) + ": " + what);
}

// strip: (N, C) float with C > 0; labels: (N) i64.
void check_strip_and_labels(const char* op, const Tensor& strip, const Tensor& labels,
                            int64_t column_begin) {
  MOEPEAK_CHECK(strip.ndim() == 2 && strip.size(1) > 0, op,
                ": strip must be (N, C) with C > 0, got ", strip.str());
  MOEPEAK_CHECK(
      labels.ndim() == 1 && labels.dtype() == DType::i64 && labels.size(0) == strip.size(0), op,
      ": labels must be i64 (", strip.size(0), "), got ", labels.str());
  MOEPEAK_CHECK(column_begin >= 0, op, ": column_begin ", column_begin, " is negative");
}

// One stored logit in double (exact for every storage type).
template <typename T>
double logit(const T* row, int64_t v) {
  return static_cast<double>(load(row[v]));
}

// The column of `label` inside a strip of `columns` starting at column_begin, or -1.
inline int64_t column_in_strip(int64_t label, int64_t column_begin, int64_t columns) {
  int64_t c = label - column_begin;
  return c >= 0 && c < columns ? c : -1;
}

}  // namespace

void check_cross_entropy_state_init_args(const char* op, const Tensor& state) {
  MOEPEAK_CHECK(state.ndim() == 2, op, ": state must be (N, 3), got ", state.str());
  check_state(op, state, state.size(0), "state");
}

void check_cross_entropy_strip_forward_args(const char* op, const Tensor& strip,
                                            const Tensor& labels, int64_t column_begin,
                                            const Tensor& state) {
  check_strip_and_labels(op, strip, labels, column_begin);
  check_state(op, state, strip.size(0), "state");
}

void check_cross_entropy_state_merge_args(const char* op, const Tensor& partial,
                                          const Tensor& state) {
  MOEPEAK_CHECK(state.ndim() == 2, op, ": state must be (N, 3), got ", state.str());
  check_state(op, state, state.size(0), "state");
  check_state(op, partial, state.size(0), "partial");
}

void check_cross_entropy_strip_backward_args(const char* op, const Tensor& strip,
                                             const Tensor& labels, int64_t column_begin,
                                             const Tensor& state, const Tensor& dstrip) {
  check_strip_and_labels(op, strip, labels, column_begin);
  check_state(op, state, strip.size(0), "state");
  dstrip.expect(strip.shape(), strip.dtype(), std::string(op) + ": dstrip");
}

void cross_entropy_state_init_cpu(const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_state_init_cpu";
  check_cross_entropy_state_init_args(op, state);
  double* s = state.data_as<double>();  // (N, 3)
  int64_t tokens = state.size(0);
  as_cpu_stream(stream).enqueue([=] {
    for (int64_t n = 0; n < tokens; ++n) {
      s[3 * n] = kMinusInf;
      s[3 * n + 1] = 0;
      s[3 * n + 2] = 0;
    }
  });
}

void cross_entropy_strip_forward_cpu(const Tensor& strip, const Tensor& labels,
                                     int64_t column_begin, const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_strip_forward_cpu";
  check_cross_entropy_strip_forward_args(op, strip, labels, column_begin, state);
  dispatch_storage(strip.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* yp = strip.data_as<T>();                  // (N, C)
    const int64_t* label = labels.data_as<int64_t>();  // (N)
    double* s = state.data_as<double>();               // (N, 3)
    int64_t tokens = strip.size(0), columns = strip.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) {
        if (label[n] == kIgnoreLabel) continue;
        const T* row = yp + n * columns;
        double strip_max = logit(row, 0);
        for (int64_t v = 1; v < columns; ++v) strip_max = std::max(strip_max, logit(row, v));
        double* st = s + 3 * n;
        const double m = std::max(st[0], strip_max);
        double sum = 0;
        for (int64_t v = 0; v < columns; ++v) sum += std::exp(logit(row, v) - m);
        // NOTES: st[0] - m is -inf before the first strip (exp gives 0, z is 0): no NaN.
        st[1] = st[1] * std::exp(st[0] - m) + sum;
        st[0] = m;
        int64_t c = column_in_strip(label[n], column_begin, columns);
        if (c >= 0) st[2] = logit(row, c);
      }
    });
  });
}

void cross_entropy_state_merge_cpu(const Tensor& partial, const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_state_merge_cpu";
  check_cross_entropy_state_merge_args(op, partial, state);
  const double* p = partial.data_as<double>();  // (N, 3)
  double* s = state.data_as<double>();          // (N, 3)
  int64_t tokens = state.size(0);
  as_cpu_stream(stream).enqueue([=] {
    for (int64_t n = 0; n < tokens; ++n) {
      const double* pt = p + 3 * n;
      double* st = s + 3 * n;
      if (pt[0] == kMinusInf) continue;  // nothing folded into the partial state
      if (st[0] == kMinusInf) {
        st[0] = pt[0];
        st[1] = pt[1];
        st[2] = pt[2];
        continue;
      }
      const double m = std::max(st[0], pt[0]);
      st[1] = st[1] * std::exp(st[0] - m) + pt[1] * std::exp(pt[0] - m);
      st[0] = m;
      st[2] += pt[2];
    }
  });
}

void cross_entropy_strip_backward_cpu(const Tensor& strip, const Tensor& labels,
                                      int64_t column_begin, const Tensor& state, double scale,
                                      const Tensor& dstrip, Stream& stream) {
  const char* op = "cross_entropy_strip_backward_cpu";
  check_cross_entropy_strip_backward_args(op, strip, labels, column_begin, state, dstrip);
  dispatch_storage(strip.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* yp = strip.data_as<T>();                  // (N, C), may be dstrip itself
    const int64_t* label = labels.data_as<int64_t>();  // (N)
    const double* s = state.data_as<double>();         // (N, 3)
    T* dp = dstrip.data_as<T>();                       // (N, C)
    int64_t tokens = strip.size(0), columns = strip.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) {
        T* drow = dp + n * columns;
        if (label[n] == kIgnoreLabel) {
          for (int64_t v = 0; v < columns; ++v) store(drow + v, C(0));
          continue;
        }
        const T* row = yp + n * columns;
        const double lse = s[3 * n] + std::log(s[3 * n + 1]);
        const int64_t target = column_in_strip(label[n], column_begin, columns);
        for (int64_t v = 0; v < columns; ++v) {
          double softmax = std::exp(logit(row, v) - lse);
          double onehot = v == target ? 1.0 : 0.0;
          store(drow + v, static_cast<C>(scale * (softmax - onehot)));
        }
      }
    });
  });
}

}  // namespace moepeak::ops
