// Helpers shared by the CPU attention tests (test_attention, test_attention_variants,
// test_attention_documents): problem sizes, random inputs and sinks in double, the float64
// reference (a materialised softmax with the window's mask and the sink's column, forward and
// backward), every tensor of one forward + backward in one dtype, a fixture that uploads,
// downloads and runs the blocked ops with poisoned outputs (and one whole forward + backward with
// a window, sinks and documents), the kernels' score counter, and error measures that do not let
// a NaN slip through.
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv) lse: (B, nh, T)            sinks, dsinks: (nh)
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/attention.h"
#include "ops/fill.h"
#include "tests/ops/gradcheck.h"

namespace moepeak::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// head_dim is dqk (q and k); v_head_dim is dv (v and out), 0 for dv = dqk.
struct Dims {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t v_head_dim = 0;
  int64_t dqk() const { return head_dim; }
  int64_t dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  Shape q_shape() const { return Shape{batch, seq, heads, dqk()}; }
  Shape k_shape() const { return Shape{batch, seq, kv_heads, dqk()}; }
  Shape v_shape() const { return Shape{batch, seq, kv_heads, dv()}; }
  Shape out_shape() const { return Shape{batch, seq, heads, dv()}; }
  Shape lse_shape() const { return Shape{batch, heads, seq}; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(dqk())); }
};

// Every tensor of one forward + backward, in one dtype.
struct AttentionTensors {
  OwnedTensor q, k, v, out, lse, dout, dq, dk, dv;
};

// Host-side inputs in double: q, k, v and the output gradient (the probe of L = sum(out * probe)).
struct Inputs {
  std::vector<double> q, k, v, dout;
};

inline Inputs random_inputs(const Dims& dims, uint64_t seed) {
  return Inputs{random_vector(dims.q_shape().numel(), seed),
                random_vector(dims.k_shape().numel(), seed + 1),
                random_vector(dims.v_shape().numel(), seed + 2),
                random_vector(dims.out_shape().numel(), seed + 3)};
}

// Sink logits off 0 and 1: normal with mean 0.3.
inline std::vector<double> random_sinks(int64_t heads, uint64_t seed) {
  std::vector<double> sinks = random_vector(static_cast<size_t>(heads), seed);
  for (double& s : sinks) s += 0.3;
  return sinks;
}

// The materialised softmax in double, row by row: row t of head h has the scores of keys
// max(0, t - W + 1) <= s <= t (every s <= t when W = 0) and, with sinks, one more column sinks[h]
// without a value. Backward by the softmax's gradient on that row: dx_s = p_s (dp_s - D) with
// dp_s = dout . v_s, D = dout . out (the sink's dp is 0), and dsinks[h] = sum of p_sink (0 - D).
// The scores run over dqk, the values, out and dout over dv.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
};

inline Reference reference(const Dims& dims, const Inputs& in, int64_t window = 0,
                           const std::vector<double>& sinks = {}) {
  const int64_t B = dims.batch, T = dims.seq, nh = dims.heads, nkv = dims.kv_heads,
                dqk = dims.dqk(), dv = dims.dv(), group = nh / nkv;
  const double scale = dims.scale();
  Reference ref{std::vector<double>(in.dout.size()), std::vector<double>(B * nh * T),
                std::vector<double>(in.q.size()),    std::vector<double>(in.k.size()),
                std::vector<double>(in.v.size()),    std::vector<double>(nh)};
  std::vector<double> x(T), p(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        const int64_t q_row = ((b * T + t) * nh + h) * dqk, o_row = ((b * T + t) * nh + h) * dv;
        auto k_row = [&](int64_t s) { return ((b * T + s) * nkv + h / group) * dqk; };
        auto v_row = [&](int64_t s) { return ((b * T + s) * nkv + h / group) * dv; };
        double row_max = sinks.empty() ? -std::numeric_limits<double>::infinity() : sinks[h];
        for (int64_t s = first; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < dqk; ++i) dot += in.q[q_row + i] * in.k[k_row(s) + i];
          x[s] = dot * scale;
          row_max = std::max(row_max, x[s]);
        }
        double sum = sinks.empty() ? 0.0 : std::exp(sinks[h] - row_max);
        for (int64_t s = first; s <= t; ++s) sum += std::exp(x[s] - row_max);
        const double lse = row_max + std::log(sum);
        ref.lse[(b * nh + h) * T + t] = lse;
        for (int64_t s = first; s <= t; ++s) p[s] = std::exp(x[s] - lse);
        double delta = 0;
        for (int64_t i = 0; i < dv; ++i) {
          double acc = 0;
          for (int64_t s = first; s <= t; ++s) acc += p[s] * in.v[v_row(s) + i];
          ref.out[o_row + i] = acc;
          delta += in.dout[o_row + i] * acc;
        }
        for (int64_t s = first; s <= t; ++s) {
          double dp = 0;
          for (int64_t i = 0; i < dv; ++i) dp += in.dout[o_row + i] * in.v[v_row(s) + i];
          const double ds = p[s] * (dp - delta);
          for (int64_t i = 0; i < dqk; ++i) {
            ref.dq[q_row + i] += scale * ds * in.k[k_row(s) + i];
            ref.dk[k_row(s) + i] += scale * ds * in.q[q_row + i];
          }
          for (int64_t i = 0; i < dv; ++i) ref.dv[v_row(s) + i] += p[s] * in.dout[o_row + i];
        }
        if (!sinks.empty()) ref.dsinks[h] -= std::exp(sinks[h] - lse) * delta;
      }
  return ref;
}

// The values rounded to bf16: inputs f32 and bf16 both hold exactly.
inline std::vector<double> rounded_to_bf16(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(bf16(static_cast<float>(x)));
  return v;
}

// Every element bitwise equal; else how many differ, and the first.
inline ::testing::AssertionResult bitwise_equal(const std::vector<double>& got,
                                                const std::vector<double>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(double)) != 0 && differ++ == 0) first = i;
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << got.size() << " elements differ, first [" << first
         << "] = " << got[first] << ", want " << want[first];
}

class AttentionTest : public ::testing::Test {
 protected:
  Stream& stream() { return backend_->default_stream(); }

  OwnedTensor make(Shape shape, const char* name, DType dtype) {
    return OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, name);
  }

  // lse in ops::attention_lse_dtype(dtype) (f32 for bf16), every other tensor in dtype.
  AttentionTensors allocate(const Dims& dims, DType dtype) {
    const DType lse = ops::attention_lse_dtype(dtype);
    return AttentionTensors{
        make(dims.q_shape(), "q", dtype),   make(dims.k_shape(), "k", dtype),
        make(dims.v_shape(), "v", dtype),   make(dims.out_shape(), "out", dtype),
        make(dims.lse_shape(), "lse", lse), make(dims.out_shape(), "dout", dtype),
        make(dims.q_shape(), "dq", dtype),  make(dims.k_shape(), "dk", dtype),
        make(dims.v_shape(), "dv", dtype)};
  }

  // CPU "device" memory is host memory: written directly (rounded to the dtype), read after
  // synchronising.
  static void upload(const OwnedTensor& t, const std::vector<double>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), t.numel());
    if (t.view().dtype() == DType::f64) {
      std::memcpy(t.data(), values.data(), values.size() * sizeof(double));
    } else if (t.view().dtype() == DType::bf16) {
      bf16* p = t.data_as<bf16>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = bf16(static_cast<float>(values[i]));
    } else {
      float* p = t.data_as<float>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<float>(values[i]);
    }
  }
  std::vector<double> download(const OwnedTensor& t) {
    stream().synchronize();
    std::vector<double> values(static_cast<size_t>(t.numel()));
    if (t.view().dtype() == DType::f64) {
      std::memcpy(values.data(), t.data(), values.size() * sizeof(double));
    } else if (t.view().dtype() == DType::bf16) {
      const bf16* p = t.data_as<bf16>();
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(p[i]);
    } else {
      const float* p = t.data_as<float>();
      for (size_t i = 0; i < values.size(); ++i) values[i] = p[i];
    }
    return values;
  }

  void upload_inputs(const AttentionTensors& t, const Inputs& in) {
    upload(t.q, in.q);
    upload(t.k, in.k);
    upload(t.v, in.v);
    upload(t.dout, in.dout);
  }

  // Poisons out and lse with NaN, runs the forward and waits for it.
  void forward(const AttentionTensors& t, const Dims& dims, ops::AttentionBlocks blocks,
               const ops::AttentionVariant& variant = {}) {
    ops::fill(t.out, kNaN, stream());
    ops::fill(t.lse, kNaN, stream());
    ops::detail::attention_forward_cpu_blocked(t.q, t.k, t.v, dims.scale(), variant, t.out, t.lse,
                                               blocks, stream());
    stream().synchronize();
  }

  // Poisons dq, dk, dv with NaN, runs the backward (dout = t.dout; dsinks, when given, is
  // accumulated into, so it is not poisoned) and waits for it.
  void backward(const AttentionTensors& t, const Dims& dims, ops::AttentionBlocks blocks,
                const ops::AttentionVariant& variant = {}, const Tensor& dsinks = Tensor()) {
    ops::fill(t.dq, kNaN, stream());
    ops::fill(t.dk, kNaN, stream());
    ops::fill(t.dv, kNaN, stream());
    ops::detail::attention_backward_cpu_blocked(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(),
                                                variant, t.dq, t.dk, t.dv, dsinks, blocks,
                                                stream());
    stream().synchronize();
  }

  // A (nh) tensor: sinks in `dtype`, or dsinks in ops::attention_lse_dtype(dtype).
  OwnedTensor head_vector(const std::vector<double>& values, DType dtype, const char* name) {
    OwnedTensor t = make(Shape{static_cast<int64_t>(values.size())}, name, dtype);
    upload(t, values);
    return t;
  }

  // doc_start as a (B, T) i32 tensor (CPU memory: written directly).
  OwnedTensor doc_tensor(const Dims& dims, const std::vector<int32_t>& starts) {
    OwnedTensor t = make(Shape{dims.batch, dims.seq}, "doc_start", DType::i32);
    EXPECT_EQ(static_cast<int64_t>(starts.size()), t.numel());
    std::copy(starts.begin(), starts.end(), t.data_as<int32_t>());
    return t;
  }

  // Everything one forward + backward returns, read back as doubles.
  struct Run {
    std::vector<double> out, lse, dq, dk, dv, dsinks;
  };

  // Forward and backward in `dtype` on `in` (rounded to it), with the window, the sinks (none
  // when empty; dsinks then starts at `dsinks_start` and is accumulated into) and doc_start
  // (undefined when empty). out, lse, dq, dk, dv are poisoned with NaN first (forward, backward).
  Run run(const Dims& dims, DType dtype, const Inputs& in, ops::AttentionBlocks blocks,
          int64_t window, const std::vector<double>& sinks, const std::vector<double>& dsinks_start,
          const std::vector<int32_t>& starts = {}) {
    AttentionTensors t = allocate(dims, dtype);
    upload_inputs(t, in);
    ops::AttentionVariant variant{window, Tensor()};
    OwnedTensor sinks_t, dsinks_t, starts_t;
    if (!sinks.empty()) {
      sinks_t = head_vector(sinks, dtype, "sinks");
      dsinks_t = head_vector(dsinks_start, ops::attention_lse_dtype(dtype), "dsinks");
      variant.sinks = sinks_t;
    }
    if (!starts.empty()) {
      starts_t = doc_tensor(dims, starts);
      variant.doc_start = starts_t;
    }
    forward(t, dims, blocks, variant);
    backward(t, dims, blocks, variant, dsinks_t);
    Run r{download(t.out), download(t.lse), download(t.dq), download(t.dk), download(t.dv), {}};
    if (!sinks.empty()) r.dsinks = download(dsinks_t);
    return r;
  }

  // The f64 kernel's gradients of L = sum(out * dout) against central differences of L through
  // the f64 forward, each the largest relative error (gradcheck.h's max_grad_rel_err): dq, dk and
  // dsinks at `step`, dv at 1e-3 (L is linear in v, so its central difference has no truncation
  // error). The window, the sinks and doc_start (undefined when empty) as in run().
  struct GradientErrors {
    double dq = 0, dk = 0, dv = 0, dsinks = 0;
  };
  GradientErrors central_difference_errors(const Dims& dims, Inputs in, std::vector<double> sinks,
                                           ops::AttentionBlocks blocks, int64_t window,
                                           const std::vector<int32_t>& starts, double step) {
    AttentionTensors t = allocate(dims, DType::f64);
    OwnedTensor sinks_t = head_vector(sinks, DType::f64, "sinks");
    OwnedTensor dsinks_t = head_vector(std::vector<double>(dims.heads, 0.0), DType::f64, "dsinks");
    OwnedTensor starts_t;
    ops::AttentionVariant variant{window, sinks_t};
    if (!starts.empty()) {
      starts_t = doc_tensor(dims, starts);
      variant.doc_start = starts_t;
    }
    upload_inputs(t, in);
    forward(t, dims, blocks, variant);
    backward(t, dims, blocks, variant, dsinks_t);
    const auto dq = download(t.dq), dk = download(t.dk), dv = download(t.dv);
    const auto dsinks = download(dsinks_t);
    auto loss = [&] {
      upload(t.q, in.q);
      upload(t.k, in.k);
      upload(t.v, in.v);
      upload(sinks_t, sinks);
      forward(t, dims, blocks, variant);
      const auto out = download(t.out);
      long double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += static_cast<long double>(out[i]) * in.dout[i];
      return static_cast<double>(sum);
    };
    GradientErrors e;
    e.dq = max_grad_rel_err(in.q, dq, loss, step);
    e.dk = max_grad_rel_err(in.k, dk, loss, step);
    e.dv = max_grad_rel_err(in.v, dv, loss, 1e-3);
    e.dsinks = max_grad_rel_err(sinks, dsinks, loss, step);
    return e;
  }

  // bf16 against f32 on inputs bf16 holds exactly (`in` and `sinks` already rounded to it; no
  // sinks when empty, dsinks then starting at `dsinks_start`; doc_start undefined when empty):
  // lse and dsinks (f32 for both) the f32 run's bitwise, out, dq, dk, dv the f32 run's rounded to
  // bf16 once. The f32 backward reads the bf16 run's out (widened), as the bf16 backward does.
  void expect_bf16_is_f32_rounded_once(const Dims& dims, const Inputs& in,
                                       ops::AttentionBlocks blocks, int64_t window,
                                       const std::vector<double>& sinks,
                                       const std::vector<double>& dsinks_start,
                                       const std::vector<int32_t>& starts = {}) {
    OwnedTensor starts_t;
    if (!starts.empty()) starts_t = doc_tensor(dims, starts);
    ops::AttentionVariant v16{window, Tensor(), starts_t}, v32{window, Tensor(), starts_t};
    OwnedTensor sinks16, sinks32, dsinks16, dsinks32;
    if (!sinks.empty()) {
      sinks16 = head_vector(sinks, DType::bf16, "sinks16");
      sinks32 = head_vector(sinks, DType::f32, "sinks32");
      dsinks16 = head_vector(dsinks_start, DType::f32, "dsinks16");
      dsinks32 = head_vector(dsinks_start, DType::f32, "dsinks32");
      v16.sinks = sinks16;
      v32.sinks = sinks32;
    }
    AttentionTensors t16 = allocate(dims, DType::bf16);
    AttentionTensors t32 = allocate(dims, DType::f32);
    upload_inputs(t16, in);
    upload_inputs(t32, in);
    forward(t16, dims, blocks, v16);
    forward(t32, dims, blocks, v32);
    const std::vector<double> out16 = download(t16.out);
    EXPECT_TRUE(bitwise_equal(out16, rounded_to_bf16(download(t32.out)))) << "out";
    EXPECT_TRUE(bitwise_equal(download(t16.lse), download(t32.lse))) << "lse";
    upload(t32.out, out16);
    backward(t16, dims, blocks, v16, dsinks16);
    backward(t32, dims, blocks, v32, dsinks32);
    EXPECT_TRUE(bitwise_equal(download(t16.dq), rounded_to_bf16(download(t32.dq)))) << "dq";
    EXPECT_TRUE(bitwise_equal(download(t16.dk), rounded_to_bf16(download(t32.dk)))) << "dk";
    EXPECT_TRUE(bitwise_equal(download(t16.dv), rounded_to_bf16(download(t32.dv)))) << "dv";
    if (!sinks.empty()) {
      EXPECT_TRUE(bitwise_equal(download(dsinks16), download(dsinks32))) << "dsinks";
    }
  }

  std::unique_ptr<Backend> backend_ = Backend::create(BackendOptions{});
};

// Score entries a call computes, from the CPU kernels' counter.
template <typename F>
int64_t scores_computed_by(F&& call) {
  const int64_t before = ops::detail::attention_cpu_scores_computed();
  call();
  return ops::detail::attention_cpu_scores_computed() - before;
}

// Largest relative error; values under `floor` in magnitude are compared absolutely at floor.
inline double max_rel_err(const std::vector<double>& got, const std::vector<double>& want,
                          double floor) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, rel_err(got[i], want[i], floor));
  }
  return worst;
}

// max |got - want| / max |want|: the error relative to the tensor's scale.
inline double norm_rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

// A gradient's error: norm_rel_err, or max |got| where the exact result is all zeros (a row whose
// softmax is a single exact 1 — a window of 1 or a one-token document without sinks — has
// dq = dk = 0, and only rounding is left).
inline double gradient_err(const std::vector<double>& got, const std::vector<double>& want) {
  if (!std::all_of(want.begin(), want.end(), [](double x) { return x == 0; }))
    return norm_rel_err(got, want);
  double largest = 0;
  for (double x : got) {
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    largest = std::max(largest, std::abs(x));
  }
  return largest;
}

inline constexpr ops::AttentionBlocks kSmallBlocks{8, 16};
inline constexpr ops::AttentionBlocks kOddBlocks{6, 5};  // rows not a multiple of the group of 4

}  // namespace moepeak::testing
