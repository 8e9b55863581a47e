// CPU RoPE: once per call the inv_freq table of the rotary dimension's r/2 frequencies
// (rope_inv_freq, ops/rope_params.h, in double); per token the cos/sin table of its position
// (computed in double, times the attention factor, rounded to the compute type: fp32 for f32 and
// bf16 storage, ops/cpu/cpu_storage.h), then the rotation of every head's r/2 pairs (rotate_half
// or interleaved) in place, each element stored (rounded) once; elements past r untouched (see
// ops/rope.h).
#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {

void check_rope_args(const char* op, const Tensor& x, const Tensor& positions,
                     const RopeParams& p) {
  MOEPEAK_CHECK(x.ndim() == 3 && x.size(2) > 0, op,
                ": x must be (N, n_heads, head_dim) with head_dim > 0, got ", x.str());
  MOEPEAK_CHECK(
      positions.ndim() == 1 && positions.dtype() == DType::i64 && positions.size(0) == x.size(0),
      op, ": positions must be i64 (", x.size(0), "), got ", positions.str(), " for x ", x.str());
  MOEPEAK_CHECK(p.rotary_dim > 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= x.size(2), op,
                ": the rotary dimension must be even and in (0, head_dim], got rotary_dim ",
                p.rotary_dim, " for x ", x.str());
  MOEPEAK_CHECK(std::isfinite(p.base) && p.base > 0, op, ": the base theta must be > 0, got ",
                p.base);
  MOEPEAK_CHECK(std::isfinite(p.factor) && p.factor > 0, op,
                ": the scaling factor must be > 0, got ", p.factor);
  MOEPEAK_CHECK(std::isfinite(p.attention_factor) && p.attention_factor > 0, op,
                ": the attention factor must be > 0, got ", p.attention_factor);
}

namespace {

// Rotates every head of every token by +angle (forward) or -angle (backward, the transpose).
template <typename T>
void rotate(T* x, const int64_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            const RopeParams& p, bool transpose) {
  using C = compute_t<T>;
  const int64_t half = p.rotary_dim / 2;
  // Scratch of rotary_dim entries, not of the token count.
  thread_local std::vector<double> inv_freq;
  thread_local std::vector<C> cos_table, sin_table;
  inv_freq.resize(static_cast<size_t>(half));
  cos_table.resize(static_cast<size_t>(half));
  sin_table.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(p, i);
  const double f = p.attention_factor;
  // Pair i: elements (i, i + half), or (2i, 2i + 1) interleaved.
  const int64_t lo_step = p.interleaved ? 2 : 1, hi_offset = p.interleaved ? 1 : half;
  for (int64_t n = 0; n < tokens; ++n) {
    double position = static_cast<double>(positions[n]);
    for (int64_t i = 0; i < half; ++i) {
      double angle = position * inv_freq[i];
      double c = std::cos(angle) * f, s = std::sin(angle) * f;
      cos_table[i] = static_cast<C>(c);
      sin_table[i] = static_cast<C>(transpose ? -s : s);
    }
    for (int64_t head = 0; head < heads; ++head) {
      T* v = x + (n * heads + head) * head_dim;  // one head: (d)
      for (int64_t i = 0; i < half; ++i) {
        T* a = v + i * lo_step;
        T* b = a + hi_offset;
        const C lo = load(*a), hi = load(*b);
        store(a, lo * cos_table[i] - hi * sin_table[i]);
        store(b, hi * cos_table[i] + lo * sin_table[i]);
      }
    }
  }
}

void rope_cpu(const char* op, const Tensor& x, const Tensor& positions, const RopeParams& p,
              bool transpose, Stream& stream) {
  check_rope_args(op, x, positions, p);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();                             // (N, n_heads, d)
    const int64_t* pos = positions.data_as<int64_t>();  // (N)
    int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
    as_cpu_stream(stream).enqueue(
        [=] { rotate<T>(xp, pos, tokens, heads, head_dim, p, transpose); });
  });
}

}  // namespace

void rope_forward_cpu(const Tensor& x, const Tensor& positions, const RopeParams& p,
                      Stream& stream) {
  rope_cpu("rope_forward_cpu", x, positions, p, /*transpose=*/false, stream);
}

void rope_backward_cpu(const Tensor& dx, const Tensor& positions, const RopeParams& p,
                       Stream& stream) {
  rope_cpu("rope_backward_cpu", dx, positions, p, /*transpose=*/true, stream);
}

}  // namespace moepeak::ops
