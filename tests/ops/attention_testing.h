// Helpers shared by the CPU attention tests (test_attention, test_attention_variants): problem
// sizes, random inputs in double, every tensor of one forward + backward in one dtype, a fixture
// that uploads, downloads and runs the blocked ops with poisoned outputs, and error measures that
// do not let a NaN slip through.
//
//   q, out, dout, dq: (B, T, nh, d)    k, v, dk, dv: (B, T, nkv, d)    lse: (B, nh, T)
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

struct Dims {
  int64_t batch, seq, heads, kv_heads, head_dim;
  Shape q_shape() const { return Shape{batch, seq, heads, head_dim}; }
  Shape kv_shape() const { return Shape{batch, seq, kv_heads, head_dim}; }
  Shape lse_shape() const { return Shape{batch, heads, seq}; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }
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
                random_vector(dims.kv_shape().numel(), seed + 1),
                random_vector(dims.kv_shape().numel(), seed + 2),
                random_vector(dims.q_shape().numel(), seed + 3)};
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
    return AttentionTensors{make(dims.q_shape(), "q", dtype),   make(dims.kv_shape(), "k", dtype),
                            make(dims.kv_shape(), "v", dtype),  make(dims.q_shape(), "out", dtype),
                            make(dims.lse_shape(), "lse", lse), make(dims.q_shape(), "dout", dtype),
                            make(dims.q_shape(), "dq", dtype),  make(dims.kv_shape(), "dk", dtype),
                            make(dims.kv_shape(), "dv", dtype)};
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

  std::unique_ptr<Backend> backend_ = Backend::create(BackendOptions{});
};

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

inline constexpr ops::AttentionBlocks kSmallBlocks{8, 16};
inline constexpr ops::AttentionBlocks kOddBlocks{6, 5};  // rows not a multiple of the group of 4

}  // namespace moepeak::testing
