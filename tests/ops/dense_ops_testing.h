// Helpers shared by the dense op tests (test_dense_ops, test_moe_ops, test_vocab_ops): a CPU
// backend, tensors made from host vectors in f32 or f64, outputs poisoned before a run so an
// element an op forgets to write fails, results read back as doubles, and error measures that
// do not let a NaN slip through (std::max silently drops NaN).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/fill.h"
#include "tests/ops/gradcheck.h"

namespace moepeak::testing {

// The CPU backend and its default stream; tensors made here live in its arena.
class OpEnv {
 public:
  OpEnv() : backend_(Backend::create(BackendOptions{})) {}
  Backend& backend() { return *backend_; }
  Stream& stream() { return backend_->default_stream(); }

  // A float tensor (f32 or f64) holding `values`, rounded to the dtype.
  OwnedTensor input(Shape shape, DType dtype, const std::vector<double>& values) {
    auto t = OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, "test input");
    EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << "input " << shape.str();
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::f32) {
        t.data_as<float>()[i] = static_cast<float>(values[i]);
      } else {
        t.data_as<double>()[i] = values[i];
      }
    }
    return t;
  }

  // An integer tensor (i32 or i64) holding `values`.
  OwnedTensor indices(Shape shape, DType dtype, const std::vector<int64_t>& values) {
    auto t = OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, "test indices");
    EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << "indices " << shape.str();
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::i32) {
        t.data_as<int32_t>()[i] = static_cast<int32_t>(values[i]);
      } else {
        t.data_as<int64_t>()[i] = values[i];
      }
    }
    return t;
  }

  // An output poisoned on the stream: NaN for floats, -12345 for integers.
  OwnedTensor output(Shape shape, DType dtype) {
    auto t = OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, "test output");
    bool is_int = dtype == DType::i32 || dtype == DType::i64;
    ops::fill(t, is_int ? -12345.0 : std::numeric_limits<double>::quiet_NaN(), stream());
    return t;
  }

  // Waits for the stream, then reads the tensor as doubles (every float and index dtype).
  std::vector<double> read(const Tensor& t) {
    stream().synchronize();
    std::vector<double> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      switch (t.dtype()) {
        case DType::f32:
          out[i] = t.data_as<float>()[i];
          break;
        case DType::f64:
          out[i] = t.data_as<double>()[i];
          break;
        case DType::bf16:  // exact in double
          out[i] = static_cast<float>(t.data_as<bf16>()[i]);
          break;
        case DType::i32:
          out[i] = t.data_as<int32_t>()[i];
          break;
        case DType::i64:
          out[i] = static_cast<double>(t.data_as<int64_t>()[i]);
          break;
        default:
          ADD_FAILURE() << "read: unsupported dtype " << t.str();
      }
    }
    return out;
  }

 private:
  std::unique_ptr<Backend> backend_;
};

// The values rounded to float: inputs both instantiations can hold exactly, so a float-vs-double
// comparison measures the op's arithmetic, not the rounding of its inputs.
inline std::vector<double> rounded_to_float(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(x);
  return v;
}

// Expects the stream to throw a moepeak::Error at synchronize() whose message has every part.
inline void expect_stream_error(Stream& stream, const std::vector<std::string>& parts) {
  try {
    stream.synchronize();
    ADD_FAILURE() << "no error at synchronize()";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& part : parts) EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

inline bool all_finite(const std::vector<double>& v) {
  for (double x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// max_i |a_i - ref_i| / max(|a_i|, |ref_i|, floor); infinity on a size mismatch or a NaN.
inline double max_rel_err(const std::vector<double>& a, const std::vector<double>& ref,
                          double floor = 1e-12) {
  if (a.size() != ref.size() || !all_finite(a) || !all_finite(ref)) return kInf;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, rel_err(a[i], ref[i], floor));
  return worst;
}

// max_i |a_i - ref_i| / max_i |ref_i|: error relative to the output's scale, meaningful where
// cancellation leaves single elements near zero. Infinity on a size mismatch or a NaN.
inline double max_scaled_err(const std::vector<double>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size() || !all_finite(a) || !all_finite(ref)) return kInf;
  double scale = 1e-300, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(ref[i]));
    diff = std::max(diff, std::abs(a[i] - ref[i]));
  }
  return diff / scale;
}

// Finite-difference step and floor for grad_err. gradcheck.h's three-point difference with
// h = 1e-6 has rounding noise ~eps * |L| / h ~ 1e-10, far above 1e-6 relative for gradient
// elements that are tiny or exactly zero (an expert the router did not choose, a class with
// probability 1e-5). The five-point central difference below has truncation error
// ~h^4 / 30 * f^(5) instead of ~h^2 / 6 * f^(3), so h can be 1e-3: truncation and rounding noise
// are then both ~1e-13 for these ops, and relative errors stay ~1e-8 down to elements of size
// kGradFloor, below which the comparison is absolute at that scale.
constexpr double kGradStep = 1e-3;
constexpr double kGradFloor = 1e-5;

// max_i rel_err(analytic_i, numeric_i, kGradFloor) with numeric_i the five-point central
// difference of `loss` along x_i; `loss` reads x, which is perturbed in place and restored.
// Infinity when the analytic gradient holds a NaN (an unwritten, poisoned element).
inline double grad_err(std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, double h = kGradStep) {
  if (x.size() != analytic.size() || !all_finite(analytic)) return kInf;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    auto loss_at = [&](double offset) {
      x[i] = saved + offset;
      return loss();
    };
    double numeric =
        (loss_at(-2 * h) - 8 * loss_at(-h) + 8 * loss_at(h) - loss_at(2 * h)) / (12 * h);
    x[i] = saved;
    double err = rel_err(analytic[i], numeric, kGradFloor);
    if (!std::isfinite(err)) return kInf;
    worst = std::max(worst, err);
  }
  return worst;
}

// Float vs double: float32 rounds at 6e-8 relative, and the ops under test combine at most a few
// hundred terms per output (in double where they reduce), so float32 lands well within 1e-5 of
// the output's scale; measured relative to the scale because single outputs may cancel to ~0.
constexpr double kFloatVsDoubleTol = 1e-5;
// Analytic vs finite-difference gradients in float64 (grad_err above).
constexpr double kGradTol = 1e-6;
// A float64 op against the test's plain float64 reference: only rounding-order differences.
constexpr double kForwardTol = 1e-12;

// ---- bf16 storage (ops/cpu/cpu_storage.h): a bf16 run against the f32 run rounded once ------

inline std::vector<double> rounded_to_bf16(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(bf16(static_cast<float>(x)));
  return v;
}

// A float tensor of `dtype` (f32 | bf16 | f64) holding `values` rounded to it.
inline OwnedTensor make_input(OpEnv& env, Shape shape, DType dtype,
                              const std::vector<double>& values) {
  if (dtype != DType::bf16) return env.input(shape, dtype, values);
  auto t = OwnedTensor::device(env.backend(), shape, dtype, LiveSet::workspace, "bf16 input");
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << "input " << shape.str();
  for (size_t i = 0; i < values.size(); ++i) {
    t.data_as<bf16>()[i] = bf16(static_cast<float>(values[i]));
  }
  return t;
}

// A tensor's elements as bf16 bits: as stored for bf16, rounded once to bf16 for f32.
inline std::vector<uint16_t> bf16_bits(OpEnv& env, const Tensor& t) {
  env.stream().synchronize();
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] =
        t.dtype() == DType::bf16 ? t.data_as<bf16>()[i].bits : bf16(t.data_as<float>()[i]).bits;
  }
  return bits;
}

// `run(storage)` makes its float tensors in `storage`, runs the ops and returns the tensors to
// compare. Expects every one of the bf16 run to be the f32 run's rounded once, bit for bit (and
// the f32 run to be finite, so two unwritten NaN outputs cannot agree).
inline void expect_bf16_is_f32_rounded_once(
    OpEnv& env, const std::function<std::vector<OwnedTensor>(DType)>& run) {
  std::vector<OwnedTensor> f = run(DType::f32);
  std::vector<OwnedTensor> b = run(DType::bf16);
  ASSERT_EQ(f.size(), b.size());
  for (size_t j = 0; j < f.size(); ++j) {
    EXPECT_TRUE(all_finite(env.read(f[j]))) << "output " << j;
    EXPECT_EQ(bf16_bits(env, b[j]), bf16_bits(env, f[j])) << "output " << j;
  }
}

}  // namespace moepeak::testing
