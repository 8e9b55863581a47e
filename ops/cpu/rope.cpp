// CPU RoPE: per token, the cos/sin table of its position (d/2 entries, computed in double and
// rounded to the compute type: fp32 for f32 and bf16 storage, ops/cpu/cpu_storage.h), then the
// rotate_half rotation of every head in place, each element stored (rounded) once (see
// ops/rope.h).
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {

// x: (N, n_heads, d) with d even and > 0; positions: (N) i64; theta > 0.
void check_rope_args(const char* op, const Tensor& x, const Tensor& positions, double theta) {
  MOEPEAK_CHECK(x.ndim() == 3 && x.size(2) % 2 == 0 && x.size(2) > 0, op,
                ": x must be (N, n_heads, head_dim) with an even head_dim, got ", x.str());
  MOEPEAK_CHECK(
      positions.ndim() == 1 && positions.dtype() == DType::i64 && positions.size(0) == x.size(0),
      op, ": positions must be i64 (", x.size(0), "), got ", positions.str(), " for x ", x.str());
  MOEPEAK_CHECK(theta > 0, op, ": theta must be > 0, got ", theta);
}

namespace {

// Rotates every head of every token by +angle (forward) or -angle (backward, the transpose).
template <typename T>
void rotate(T* x, const int64_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            double theta, bool transpose) {
  using C = compute_t<T>;
  int64_t half = head_dim / 2;
  // Scratch of head_dim entries, not of the token count.
  thread_local std::vector<C> cos_table, sin_table;
  cos_table.resize(static_cast<size_t>(half));
  sin_table.resize(static_cast<size_t>(half));
  for (int64_t n = 0; n < tokens; ++n) {
    double position = static_cast<double>(positions[n]);
    for (int64_t i = 0; i < half; ++i) {
      double inv_freq =
          std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      double angle = position * inv_freq;
      cos_table[i] = static_cast<C>(std::cos(angle));
      sin_table[i] = static_cast<C>(transpose ? -std::sin(angle) : std::sin(angle));
    }
    for (int64_t head = 0; head < heads; ++head) {
      T* v = x + (n * heads + head) * head_dim;  // one head: (d)
      for (int64_t i = 0; i < half; ++i) {
        const C lo = load(v[i]), hi = load(v[i + half]);
        store(v + i, lo * cos_table[i] - hi * sin_table[i]);
        store(v + i + half, hi * cos_table[i] + lo * sin_table[i]);
      }
    }
  }
}

void rope_cpu(const char* op, const Tensor& x, const Tensor& positions, double theta,
              bool transpose, Stream& stream) {
  check_rope_args(op, x, positions, theta);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();                             // (N, n_heads, d)
    const int64_t* pos = positions.data_as<int64_t>();  // (N)
    int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
    as_cpu_stream(stream).enqueue(
        [=] { rotate<T>(xp, pos, tokens, heads, head_dim, theta, transpose); });
  });
}

}  // namespace

void rope_forward_cpu(const Tensor& x, const Tensor& positions, double theta, Stream& stream) {
  rope_cpu("rope_forward_cpu", x, positions, theta, /*transpose=*/false, stream);
}

void rope_backward_cpu(const Tensor& dx, const Tensor& positions, double theta, Stream& stream) {
  rope_cpu("rope_backward_cpu", dx, positions, theta, /*transpose=*/true, stream);
}

}  // namespace moepeak::ops
