// RoPE scaling on the CPU backend (ops/rope_scaling.h, ops/rope_params.h, ops/rope.h).
//
// 1. Frequencies: rope_params + rope_inv_freq and the attention factor of every type against
//    Hugging Face transformers' formulas (modeling_rope_utils.py) written out again below, in
//    double and in transformers' own shape (1 / base^(2i/dim), torch.where bands, the yarn blend
//    of 1 / (factor * pos_freqs) and 1 / pos_freqs), for gpt-oss, DeepSeek-V3, Llama-3.1 and
//    more; the default type bitwise the op's historical pow(theta, -2i/d); bad parameters throw,
//    naming the field.
// 2. The op, forward and backward, for each type, partial rotary and interleaved pairs, against a
//    float64 reference rotation written out here: f64 to rounding order, f32 and bf16 within
//    tolerances (reasons at the constants), bf16 bitwise the f32 result rounded once, elements
//    past the rotary dimension bitwise untouched, and the backward as the exact transpose
//    (<F x, y> = <x, B y>; B F = f^2). The default type bitwise the op as it was before RoPE
//    scaling (its loop written out here), in f64, f32 and bf16.
// The CUDA kernel against the CPU: tests/ops/backend_ops/cases_rope.cpp.
// Run: ./build/tests/ops/test_rope_scaling
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/dtype.h"
#include "ops/rope.h"
#include "ops/rope_scaling.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using ops::RopeParams;
using ops::RopeScaling;
using ops::RopeType;
using testing::dot;
using testing::expect_bf16_is_f32_rounded_once;
using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::make_input;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_bf16;
using testing::rounded_to_float;

// ---------------------------------------------------------------------------------------------
// transformers' formulas, again (double; transformers runs the tensor parts in fp32)

constexpr double kPi = 3.14159265358979323846;

struct Reference {
  std::vector<double> inv_freq;  // dim / 2 entries
  double attention_factor = 1.0;
};

// _compute_default_rope_parameters: 1 / base^(arange(0, dim, 2) / dim).
std::vector<double> hf_default(double base, int64_t dim) {
  std::vector<double> inv;
  for (int64_t j = 0; j < dim; j += 2) {
    inv.push_back(1.0 / std::pow(base, static_cast<double>(j) / static_cast<double>(dim)));
  }
  return inv;
}

// _compute_linear_scaling_rope_parameters: inv_freq /= factor.
Reference hf_linear(double base, int64_t dim, double factor) {
  Reference r{hf_default(base, dim)};
  for (double& v : r.inv_freq) v /= factor;
  return r;
}

// _compute_dynamic_ntk_parameters: seq_len = max(seq_len, max_position_embeddings).
Reference hf_dynamic(double base, int64_t dim, int64_t max_pos, double factor, int64_t seq_len) {
  const double L = static_cast<double>(std::max(seq_len, max_pos));
  const double d = static_cast<double>(dim);
  base = base * std::pow(factor * L / static_cast<double>(max_pos) - (factor - 1), d / (d - 2));
  return Reference{hf_default(base, dim)};
}

struct Yarn {
  double factor = 0;
  double orig = 0;
  std::optional<double> beta_fast, beta_slow;
  bool truncate = true;
  std::optional<double> attention_factor, mscale, mscale_all_dim;
};

// _compute_yarn_parameters (transformers 5, the factor as given).
Reference hf_yarn(double base, int64_t dim, const Yarn& y) {
  auto get_mscale = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  Reference r;
  if (y.attention_factor) {
    r.attention_factor = *y.attention_factor;
  } else if (y.mscale.value_or(0) != 0 && y.mscale_all_dim.value_or(0) != 0) {
    r.attention_factor = get_mscale(y.factor, *y.mscale) / get_mscale(y.factor, *y.mscale_all_dim);
  } else {
    r.attention_factor = get_mscale(y.factor, 1);
  }
  const double beta_fast = y.beta_fast.value_or(0) != 0 ? *y.beta_fast : 32;
  const double beta_slow = y.beta_slow.value_or(0) != 0 ? *y.beta_slow : 1;
  const double d = static_cast<double>(dim);
  auto find_correction_dim = [&](double rotations) {
    return (d * std::log(y.orig / (rotations * 2 * kPi))) / (2 * std::log(base));
  };
  double low = find_correction_dim(beta_fast), high = find_correction_dim(beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * i) / d);
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (y.factor * pos_freq);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1 - ramp;
    r.inv_freq.push_back(interpolation * (1 - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
  return r;
}

// _compute_llama3_parameters.
Reference hf_llama3(double base, int64_t dim, double factor, double low_freq_factor,
                    double high_freq_factor, double old_context_len) {
  Reference r{hf_default(base, dim)};
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  for (double& inv : r.inv_freq) {
    const double wavelen = 2 * kPi / inv;
    const double llama = wavelen > low_freq_wavelen ? inv / factor : inv;
    const double smooth =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    inv = medium ? smoothed : llama;
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// 1. Frequencies and attention factors

// Frequencies in double from two routes (pow(b, -x) against 1 / pow(b, x); inv / factor against
// 1 / (factor * pos)): a few ulps apart (measured <= 3.2e-16 relative); a wrong formula, band or
// ramp bound is off by far more (a factor >= 2 between the extremes).
constexpr double kFreqTol = 1e-14;

void expect_matches(const RopeParams& p, const Reference& ref, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ref.inv_freq.size()), p.rotary_dim / 2) << what;
  for (int64_t i = 0; i < p.rotary_dim / 2; ++i) {
    const double want = ref.inv_freq[static_cast<size_t>(i)];
    EXPECT_LE(std::abs(ops::rope_inv_freq(p, i) - want), kFreqTol * want)
        << what << ": inv_freq[" << i << "] = " << ops::rope_inv_freq(p, i) << ", want " << want;
  }
  EXPECT_NEAR(p.attention_factor, ref.attention_factor, 1e-15 * ref.attention_factor) << what;
}

RopeScaling scaling(RopeType type, std::optional<double> factor = std::nullopt) {
  RopeScaling s;
  s.type = type;
  s.factor = factor;
  return s;
}

// How many frequencies the scaling left alone (ratio 1), divided by factor, or moved between.
struct Bands {
  int kept = 0, divided = 0, between = 0;
};
Bands bands(const RopeParams& p, double theta, double factor) {
  Bands b;
  const RopeParams plain = RopeParams::standard(theta, p.rotary_dim);
  for (int64_t i = 0; i < p.rotary_dim / 2; ++i) {
    const double ratio = ops::rope_inv_freq(p, i) / ops::rope_inv_freq(plain, i);
    if (std::abs(ratio - 1) < 1e-12) {
      ++b.kept;
    } else if (std::abs(ratio * factor - 1) < 1e-12) {
      ++b.divided;
    } else {
      ++b.between;
    }
  }
  return b;
}

TEST(RopeScaling, DefaultIsBitwiseThePlainRope) {
  for (double theta : {1e4, 1e6, 150000.0}) {
    for (int64_t d : {2, 8, 64, 128}) {
      const RopeParams standard = RopeParams::standard(theta, d);
      const RopeParams from_config =
          ops::rope_params(scaling(RopeType::default_), theta, d, 4096, 0, false);
      const RopeParams linear_one =
          ops::rope_params(scaling(RopeType::linear, 1.0), theta, d, 4096, 0, false);
      for (int64_t i = 0; i < d / 2; ++i) {
        // The expression ops/cpu/rope.cpp and ops/cuda/rope.cu have always used.
        const double historical =
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        EXPECT_EQ(ops::rope_inv_freq(standard, i), historical) << theta << " " << d << " " << i;
        EXPECT_EQ(ops::rope_inv_freq(from_config, i), historical);
        EXPECT_EQ(ops::rope_inv_freq(linear_one, i), historical);
      }
      EXPECT_EQ(standard.attention_factor, 1.0);
      EXPECT_EQ(from_config.attention_factor, 1.0);
      expect_matches(standard, Reference{hf_default(theta, d)}, "default");
    }
  }
}

TEST(RopeScaling, LinearDividesByTheFactor) {
  const RopeParams p = ops::rope_params(scaling(RopeType::linear, 4.0), 1e4, 128, 4096, 0, false);
  expect_matches(p, hf_linear(1e4, 128, 4.0), "linear factor 4");
  EXPECT_EQ(bands(p, 1e4, 4.0).divided, 64);
}

TEST(RopeScaling, DynamicScalesTheBaseOnlyPastMaxPositions) {
  const RopeScaling s = scaling(RopeType::dynamic, 2.0);
  for (int64_t seq_len : {1, 2048, 4096, 4097, 10000, 131072}) {
    const RopeParams p = ops::rope_params(s, 1e4, 128, 4096, seq_len, false);
    const std::string what = "dynamic factor 2, L = " + std::to_string(seq_len);
    expect_matches(p, hf_dynamic(1e4, 128, 4096, 2.0, seq_len), what);
    if (seq_len <= 4096) {
      // Below or at max_position_embeddings: the plain frequencies, bitwise.
      EXPECT_EQ(p.base, 1e4) << what;
      EXPECT_EQ(bands(p, 1e4, 2.0).kept, 64) << what;
    } else {
      EXPECT_GT(p.base, 1e4) << what;
      // Frequency 0 is 1 whatever the base; all others are lower.
      EXPECT_EQ(bands(p, 1e4, 2.0).kept, 1) << what;
    }
  }
  // Partial rotary: dim = rotary_dim in the exponent.
  const RopeParams partial = ops::rope_params(s, 1e4, 32, 4096, 9000, false);
  expect_matches(partial, hf_dynamic(1e4, 32, 4096, 2.0, 9000), "dynamic rotary_dim 32");
}

TEST(RopeScaling, YarnAsGptOss) {
  // gpt-oss: rope_theta 150000, head_dim 64, {factor 32, original 4096, beta_fast 32,
  // beta_slow 1, truncate false}, max_position_embeddings 131072.
  RopeScaling s = scaling(RopeType::yarn, 32.0);
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 32;
  s.beta_slow = 1;
  s.truncate = false;
  const RopeParams p = ops::rope_params(s, 150000, 64, 131072, 0, false);
  Yarn y;
  y.factor = 32;
  y.orig = 4096;
  y.beta_fast = 32;
  y.beta_slow = 1;
  y.truncate = false;
  expect_matches(p, hf_yarn(150000, 64, y), "gpt-oss");
  EXPECT_DOUBLE_EQ(p.attention_factor, 0.1 * std::log(32.0) + 1);  // 1.3465...
  // Not truncated: the ramp's bounds are the correction dims themselves (8.09..., 17.39...).
  EXPECT_NE(p.ramp_low, std::floor(p.ramp_low));
  EXPECT_NE(p.ramp_high, std::ceil(p.ramp_high));
  const Bands b = bands(p, 150000, 32);
  EXPECT_GT(b.kept, 0);
  EXPECT_GT(b.divided, 0);
  EXPECT_GT(b.between, 0);
  // The same with truncation (the default): integer bounds, other frequencies.
  s.truncate = true;
  y.truncate = true;
  const RopeParams t = ops::rope_params(s, 150000, 64, 131072, 0, false);
  expect_matches(t, hf_yarn(150000, 64, y), "gpt-oss truncated");
  EXPECT_EQ(t.ramp_low, std::floor(p.ramp_low));
  EXPECT_EQ(t.ramp_high, std::ceil(p.ramp_high));
}

TEST(RopeScaling, YarnAsDeepSeekV3) {
  // DeepSeek-V3: rope_theta 10000, qk_rope_head_dim 64, {factor 40, original 4096, beta_fast 32,
  // beta_slow 1, mscale 1.0, mscale_all_dim 1.0}: the attention factor is 1.
  RopeScaling s = scaling(RopeType::yarn, 40.0);
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 32;
  s.beta_slow = 1;
  s.mscale = 1.0;
  s.mscale_all_dim = 1.0;
  const RopeParams p = ops::rope_params(s, 1e4, 64, 163840, 0, true);
  Yarn y;
  y.factor = 40;
  y.orig = 4096;
  y.mscale = 1.0;
  y.mscale_all_dim = 1.0;
  expect_matches(p, hf_yarn(1e4, 64, y), "DeepSeek-V3");
  EXPECT_EQ(p.attention_factor, 1.0);
  EXPECT_TRUE(p.interleaved);
  // mscale != mscale_all_dim: the ratio of the two get_mscale values.
  s.mscale_all_dim = 0.5;
  y.mscale_all_dim = 0.5;
  const RopeParams q = ops::rope_params(s, 1e4, 64, 163840, 0, false);
  expect_matches(q, hf_yarn(1e4, 64, y), "mscale 1, mscale_all_dim 0.5");
  EXPECT_GT(q.attention_factor, 1.1);
  // mscale 0 counts as not given (transformers' `if mscale and mscale_all_dim`).
  s.mscale = 0.0;
  EXPECT_DOUBLE_EQ(ops::rope_params(s, 1e4, 64, 163840, 0, false).attention_factor,
                   0.1 * std::log(40.0) + 1);
}

TEST(RopeScaling, YarnDefaultsGivenFactorsAndDerivedFactor) {
  // Betas absent (and 0, transformers' `or`): 32 and 1; truncate true.
  RopeScaling s = scaling(RopeType::yarn, 4.0);
  s.original_max_position_embeddings = 32768;
  Yarn y;
  y.factor = 4;
  y.orig = 32768;
  expect_matches(ops::rope_params(s, 1e6, 128, 131072, 0, false), hf_yarn(1e6, 128, y),
                 "factor 4, default betas");
  s.beta_fast = 0;
  s.beta_slow = 0;
  expect_matches(ops::rope_params(s, 1e6, 128, 131072, 0, false), hf_yarn(1e6, 128, y), "betas 0");
  // A given attention factor wins; partial rotary: dim = 32 in every formula.
  s.attention_factor = 0.8;
  y.attention_factor = 0.8;
  const RopeParams partial = ops::rope_params(s, 1e6, 32, 131072, 0, false);
  expect_matches(partial, hf_yarn(1e6, 32, y), "attention_factor 0.8, rotary_dim 32");
  EXPECT_EQ(partial.attention_factor, 0.8);
  // original_max_position_embeddings absent: max_position_embeddings.
  RopeScaling no_orig = scaling(RopeType::yarn, 8.0);
  Yarn yo;
  yo.factor = 8;
  yo.orig = 4096;
  expect_matches(ops::rope_params(no_orig, 1e4, 64, 4096, 0, false), hf_yarn(1e4, 64, yo),
                 "no original_max_position_embeddings");
  // factor absent: max_position_embeddings / original (transformers 5).
  RopeScaling derived = scaling(RopeType::yarn);
  derived.original_max_position_embeddings = 4096;
  Yarn yd;
  yd.factor = 32;
  yd.orig = 4096;
  const RopeParams d = ops::rope_params(derived, 150000, 64, 131072, 0, false);
  EXPECT_EQ(d.factor, 32.0);
  expect_matches(d, hf_yarn(150000, 64, yd), "factor from max_position_embeddings / original");
  // beta_fast == beta_slow, not truncated: low == high, and high gets +0.001.
  RopeScaling equal = scaling(RopeType::yarn, 16.0);
  equal.original_max_position_embeddings = 4096;
  equal.beta_fast = 8;
  equal.beta_slow = 8;
  equal.truncate = false;
  Yarn ye;
  ye.factor = 16;
  ye.orig = 4096;
  ye.beta_fast = 8;
  ye.beta_slow = 8;
  ye.truncate = false;
  const RopeParams e = ops::rope_params(equal, 1e4, 64, 65536, 0, false);
  EXPECT_NEAR(e.ramp_high - e.ramp_low, 0.001, 1e-12);
  expect_matches(e, hf_yarn(1e4, 64, ye), "beta_fast == beta_slow");
}

TEST(RopeScaling, Llama3AsLlama31) {
  // Llama-3.1: rope_theta 500000, head_dim 128, {factor 8, low_freq_factor 1,
  // high_freq_factor 4, original_max_position_embeddings 8192}.
  RopeScaling s = scaling(RopeType::llama3, 8.0);
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  const RopeParams p = ops::rope_params(s, 500000, 128, 131072, 0, false);
  expect_matches(p, hf_llama3(500000, 128, 8, 1, 4, 8192), "Llama-3.1");
  EXPECT_EQ(p.attention_factor, 1.0);
  const Bands b = bands(p, 500000, 8);
  EXPECT_GT(b.kept, 0);
  EXPECT_GT(b.divided, 0);
  EXPECT_GT(b.between, 0);
  EXPECT_EQ(b.kept + b.divided + b.between, 64);
  const RopeParams partial = ops::rope_params(s, 500000, 64, 131072, 0, true);
  expect_matches(partial, hf_llama3(500000, 64, 8, 1, 4, 8192), "llama3 rotary_dim 64");
}

TEST(RopeScaling, TypeNamesAreTransformers) {
  for (RopeType t : {RopeType::default_, RopeType::linear, RopeType::dynamic, RopeType::yarn,
                     RopeType::llama3}) {
    EXPECT_EQ(ops::rope_type_from_name(ops::rope_type_name(t)), t);
  }
  EXPECT_STREQ(ops::rope_type_name(RopeType::default_), "default");
  EXPECT_STREQ(ops::rope_type_name(RopeType::llama3), "llama3");
  EXPECT_FALSE(ops::rope_type_from_name("longrope").has_value());
  EXPECT_FALSE(ops::rope_type_from_name("Yarn").has_value());
}

// Expects rope_params to throw an input Error whose message names `field`.
void expect_rejected(const RopeScaling& s, const std::string& field, double theta = 1e4,
                     int64_t rotary_dim = 64, int64_t max_pos = 4096, int64_t seq_len = 0) {
  try {
    ops::rope_params(s, theta, rotary_dim, max_pos, seq_len, false);
    ADD_FAILURE() << "no error for " << ops::rope_type_name(s.type) << ", expected one naming "
                  << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(RopeScaling, RejectsBadParameters) {
  expect_rejected(scaling(RopeType::default_), "rope_theta", 0.0);
  expect_rejected(scaling(RopeType::default_), "rope_theta", -1e4);
  expect_rejected(scaling(RopeType::default_), "rotary dimension", 1e4, 63);
  expect_rejected(scaling(RopeType::default_), "rotary dimension", 1e4, 0);
  expect_rejected(scaling(RopeType::linear), "factor");
  expect_rejected(scaling(RopeType::linear, 0.5), "factor");
  expect_rejected(scaling(RopeType::linear, std::nan("")), "factor");
  expect_rejected(scaling(RopeType::dynamic), "factor");
  expect_rejected(scaling(RopeType::dynamic, 2.0), "rotary dimension", 1e4, 2);
  expect_rejected(scaling(RopeType::dynamic, 2.0), "sequence length", 1e4, 64, 4096, -1);
  expect_rejected(scaling(RopeType::dynamic, 2.0), "max_position_embeddings", 1e4, 64, 0, 10);
  // yarn without factor (and without original_max_position_embeddings to derive it from).
  expect_rejected(scaling(RopeType::yarn), "factor");
  RopeScaling yarn = scaling(RopeType::yarn, 32.0);
  yarn.original_max_position_embeddings = 0;
  expect_rejected(yarn, "original_max_position_embeddings");
  yarn.original_max_position_embeddings = 4096;
  RopeScaling betas = yarn;
  betas.beta_fast = 1;
  betas.beta_slow = 32;
  expect_rejected(betas, "beta_fast");
  betas.beta_fast = -4;
  betas.beta_slow = std::nullopt;
  expect_rejected(betas, "beta_fast");
  RopeScaling attention = yarn;
  attention.attention_factor = 0.0;
  expect_rejected(attention, "attention_factor");
  attention.attention_factor = -1.0;
  expect_rejected(attention, "attention_factor");
  RopeScaling derived = scaling(RopeType::yarn);
  derived.original_max_position_embeddings = 8192;  // > max_position_embeddings: factor 0.5
  expect_rejected(derived, "original_max_position_embeddings");
  // llama3: every field required, high_freq_factor > low_freq_factor > 0.
  RopeScaling llama = scaling(RopeType::llama3, 8.0);
  llama.low_freq_factor = 1;
  llama.high_freq_factor = 4;
  llama.original_max_position_embeddings = 8192;
  EXPECT_NO_THROW(ops::rope_params(llama, 5e5, 128, 131072, 0, false));
  RopeScaling bad = llama;
  bad.high_freq_factor = 1;
  expect_rejected(bad, "high_freq_factor");
  bad.high_freq_factor = 0.5;
  expect_rejected(bad, "high_freq_factor");
  bad = llama;
  bad.low_freq_factor = std::nullopt;
  expect_rejected(bad, "low_freq_factor");
  bad.low_freq_factor = 0;
  expect_rejected(bad, "low_freq_factor");
  bad = llama;
  bad.factor = std::nullopt;
  expect_rejected(bad, "factor");
}

TEST(RopeScaling, TheOpRejectsParametersThatDoNotFitTheHead) {
  OpEnv env;
  auto x = env.input({2, 1, 8}, DType::f64, random_vector(16, 300));
  auto pos = env.indices({2}, DType::i64, {0, 1});
  RopeParams p = RopeParams::standard(1e4, 10);  // rotary_dim > head_dim
  EXPECT_THROW(ops::rope_forward_cpu(x, pos, p, env.stream()), Error);
  p = RopeParams::standard(1e4, 5);  // odd
  EXPECT_THROW(ops::rope_backward_cpu(x, pos, p, env.stream()), Error);
  p = RopeParams::standard(1e4, 8);
  p.attention_factor = 0;
  EXPECT_THROW(ops::rope_forward_cpu(x, pos, p, env.stream()), Error);
  p = RopeParams::standard(0, 8);
  EXPECT_THROW(ops::rope_forward_cpu(x, pos, p, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// 2. The op against a float64 reference rotation

constexpr int64_t kTokens = 6, kHeads = 3;
// As in test_dense_ops: a chunk in the middle of a sequence and a long-context position.
const std::vector<int64_t> kPositions = {0, 1, 7, 4096, 4097, 131071};

// f32 against the f64 reference: fp32 rounds f * cos, f * sin and each product and sum at 6e-8
// relative (the angles are double in both), so results land within ~3e-7 of the output's scale
// (measured <= 1.1e-7); kFloatVsDoubleTol (1e-5) as for every dense op.
// bf16 against the f64 reference on the same (bf16-rounded) input: the f32 result rounded once to
// bf16, so within half a bf16 ulp (8 significant bits: at most 2^-8 of the element, so of the
// scale) plus the f32 error (~3e-7): below 5e-3 of the scale (measured <= 2.9e-3).
constexpr double kBf16VsDoubleTol = 5e-3;

struct Case {
  std::string name;
  int64_t head_dim;
  RopeParams params;
  Reference hf;  // transformers' frequencies for the end-to-end check
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"default d=8", 8, RopeParams::standard(1e4, 8), Reference{hf_default(1e4, 8)}});
  RopeParams interleaved = RopeParams::standard(1e4, 16);
  interleaved.interleaved = true;
  c.push_back({"default interleaved d=16", 16, interleaved, Reference{hf_default(1e4, 16)}});
  c.push_back({"default partial d=10 rot=4", 10,
               ops::rope_params(scaling(RopeType::default_), 1e4, 4, 4096, 0, false),
               Reference{hf_default(1e4, 4)}});
  c.push_back({"linear 4 d=16", 16,
               ops::rope_params(scaling(RopeType::linear, 4.0), 1e4, 16, 4096, 0, false),
               hf_linear(1e4, 16, 4)});
  c.push_back({"dynamic 2 L>max d=16", 16,
               ops::rope_params(scaling(RopeType::dynamic, 2.0), 1e4, 16, 4096, 131072, false),
               hf_dynamic(1e4, 16, 4096, 2, 131072)});
  RopeScaling gpt_oss = scaling(RopeType::yarn, 32.0);
  gpt_oss.original_max_position_embeddings = 4096;
  gpt_oss.truncate = false;
  Yarn y;
  y.factor = 32;
  y.orig = 4096;
  y.truncate = false;
  c.push_back({"yarn gpt-oss d=64", 64, ops::rope_params(gpt_oss, 150000, 64, 131072, 0, false),
               hf_yarn(150000, 64, y)});
  c.push_back({"yarn gpt-oss partial interleaved d=24 rot=16", 24,
               ops::rope_params(gpt_oss, 150000, 16, 131072, 0, true), hf_yarn(150000, 16, y)});
  RopeScaling llama = scaling(RopeType::llama3, 8.0);
  llama.low_freq_factor = 1;
  llama.high_freq_factor = 4;
  llama.original_max_position_embeddings = 8192;
  c.push_back({"llama3 d=32", 32, ops::rope_params(llama, 500000, 32, 131072, 0, false),
               hf_llama3(500000, 32, 8, 1, 4, 8192)});
  c.push_back({"llama3 partial interleaved d=20 rot=12", 20,
               ops::rope_params(llama, 500000, 12, 131072, 0, true),
               hf_llama3(500000, 12, 8, 1, 4, 8192)});
  return c;
}

// The rotation in float64: pair i of each head is (i, i + r/2) or (2i, 2i+1), rotated by
// position * inv_freq[i] and scaled by f; the backward by -angle with the same f; elements past
// r copied.
std::vector<double> reference(const std::vector<double>& x, int64_t head_dim, const RopeParams& p,
                              const std::vector<double>& inv_freq, bool backward) {
  std::vector<double> out = x;
  const int64_t half = p.rotary_dim / 2;
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t base = (n * kHeads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(kPositions[n]) * inv_freq[i];
        const double c = p.attention_factor * std::cos(angle);
        const double s = (backward ? -1.0 : 1.0) * p.attention_factor * std::sin(angle);
        const int64_t lo = base + (p.interleaved ? 2 * i : i);
        const int64_t hi = lo + (p.interleaved ? 1 : half);
        out[lo] = x[lo] * c - x[hi] * s;
        out[hi] = x[hi] * c + x[lo] * s;
      }
    }
  }
  return out;
}

std::vector<double> run(OpEnv& env, const Case& c, DType dtype, const std::vector<double>& x,
                        bool backward) {
  auto xt = make_input(env, {kTokens, kHeads, c.head_dim}, dtype, x);
  auto pos = env.indices({kTokens}, DType::i64, kPositions);
  if (backward) {
    ops::rope_backward_cpu(xt, pos, c.params, env.stream());
  } else {
    ops::rope_forward_cpu(xt, pos, c.params, env.stream());
  }
  return env.read(xt);
}

std::vector<double> op_inv_freq(const RopeParams& p) {
  std::vector<double> inv;
  for (int64_t i = 0; i < p.rotary_dim / 2; ++i) inv.push_back(ops::rope_inv_freq(p, i));
  return inv;
}

// The plain RoPE as the op computed it before RopeParams, on host data: per token and frequency
// one pow(theta, -2i/d), the angle, cos and sin in double rounded to the compute type C, and the
// rotate_half rotation in C, each element rounded once to the storage type T.
float to_compute(bf16 v) { return static_cast<float>(v); }
float to_compute(float v) { return v; }
double to_compute(double v) { return v; }
template <typename T, typename C>
T to_storage(C v) {
  return T(v);
}

template <typename T, typename C>
void historical_rope(std::vector<T>& x, int64_t head_dim, double theta, bool backward) {
  const int64_t half = head_dim / 2;
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv =
          std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(kPositions[n]) * inv;
      const C c = static_cast<C>(std::cos(angle));
      const C s = static_cast<C>(backward ? -std::sin(angle) : std::sin(angle));
      for (int64_t h = 0; h < kHeads; ++h) {
        T* v = x.data() + (n * kHeads + h) * head_dim;
        const C lo = to_compute(v[i]), hi = to_compute(v[i + half]);
        v[i] = to_storage<T, C>(lo * c - hi * s);
        v[i + half] = to_storage<T, C>(hi * c + lo * s);
      }
    }
  }
}

template <typename T, typename C>
void expect_historical_bits(OpEnv& env, DType dtype, int64_t head_dim, double theta, bool backward,
                            uint64_t seed) {
  const auto values = rounded_to_bf16(random_vector(kTokens * kHeads * head_dim, seed));
  auto xt = make_input(env, {kTokens, kHeads, head_dim}, dtype, values);
  std::vector<T> want(xt.data_as<T>(), xt.data_as<T>() + values.size());
  auto pos = env.indices({kTokens}, DType::i64, kPositions);
  const RopeParams p =
      ops::rope_params(scaling(RopeType::default_), theta, head_dim, 4096, 0, false);
  if (backward) {
    ops::rope_backward_cpu(xt, pos, p, env.stream());
  } else {
    ops::rope_forward_cpu(xt, pos, p, env.stream());
  }
  env.stream().synchronize();
  historical_rope<T, C>(want, head_dim, theta, backward);
  const T* got = xt.data_as<T>();
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(std::memcmp(&got[k], &want[k], sizeof(T)), 0)
        << dtype_name(dtype) << " d=" << head_dim << " theta=" << theta
        << (backward ? " backward" : " forward") << " element " << k << ": " << to_compute(got[k])
        << ", historically " << to_compute(want[k]);
  }
}

TEST(RopeScalingOp, DefaultIsBitwiseTheHistoricalOp) {
  OpEnv env;
  uint64_t seed = 390;
  for (double theta : {1e4, 1e6}) {
    for (int64_t d : {8, 128}) {
      for (bool backward : {false, true}) {
        expect_historical_bits<double, double>(env, DType::f64, d, theta, backward, seed++);
        expect_historical_bits<float, float>(env, DType::f32, d, theta, backward, seed++);
        expect_historical_bits<bf16, float>(env, DType::bf16, d, theta, backward, seed++);
      }
    }
  }
}

TEST(RopeScalingOp, F64MatchesTheReferenceRotation) {
  OpEnv env;
  uint64_t seed = 310;
  for (const Case& c : cases()) {
    const auto x = random_vector(kTokens * kHeads * c.head_dim, seed++);
    for (bool backward : {false, true}) {
      const std::string what = c.name + (backward ? " backward" : " forward");
      const auto got = run(env, c, DType::f64, x, backward);
      // The op's own frequencies: the rotation alone, equal up to the order of roundings.
      EXPECT_LT(
          max_scaled_err(got, reference(x, c.head_dim, c.params, op_inv_freq(c.params), backward)),
          kForwardTol)
          << what;
      // transformers' frequencies end to end: they differ from the op's by a few ulps (<= ~4e-16
      // relative), which angles up to 131071 rad turn into <= ~5e-11 absolute (measured 8.8e-12).
      EXPECT_LT(max_scaled_err(got, reference(x, c.head_dim, c.params, c.hf.inv_freq, backward)),
                1e-10)
          << what;
      // Elements past the rotary dimension pass through bitwise.
      for (int64_t n = 0; n < kTokens * kHeads; ++n) {
        for (int64_t j = c.params.rotary_dim; j < c.head_dim; ++j) {
          const size_t k = static_cast<size_t>(n * c.head_dim + j);
          ASSERT_EQ(got[k], x[k]) << what << " element " << j;
        }
      }
    }
    EXPECT_DOUBLE_EQ(c.params.attention_factor, c.hf.attention_factor) << c.name;
  }
}

TEST(RopeScalingOp, BackwardIsTheExactTranspose) {
  OpEnv env;
  uint64_t seed = 330;
  for (const Case& c : cases()) {
    const auto x = random_vector(kTokens * kHeads * c.head_dim, seed++);
    const auto y = random_vector(x.size(), seed++);
    const auto fx = run(env, c, DType::f64, x, false);
    const auto by = run(env, c, DType::f64, y, true);
    // <F x, y> = <x, B y>: the two sums of products differ by rounding only (measured <= 5e-17
    // of |F x| |y|); a backward that is not the transpose (a wrong sign, pair or factor) is off
    // by O(1).
    const double scale = std::sqrt(dot(fx, fx) * dot(y, y));
    EXPECT_LT(std::abs(dot(fx, y) - dot(x, by)), 1e-14 * scale) << c.name;
    // B F x = f^2 x on the rotated elements (the rotation is orthogonal; f scales both ways),
    // x past the rotary dimension.
    const double f2 = c.params.attention_factor * c.params.attention_factor;
    auto bfx = run(env, c, DType::f64, fx, true);
    for (size_t k = 0; k < bfx.size(); ++k) {
      if (static_cast<int64_t>(k) % c.head_dim < c.params.rotary_dim) bfx[k] /= f2;
    }
    EXPECT_LT(max_scaled_err(bfx, x), 1e-12) << c.name;
  }
}

TEST(RopeScalingOp, FloatAndBf16WithinTolerance) {
  OpEnv env;
  uint64_t seed = 350;
  for (const Case& c : cases()) {
    const auto x = random_vector(kTokens * kHeads * c.head_dim, seed++);
    const auto xf = rounded_to_float(x), xb = rounded_to_bf16(x);
    for (bool backward : {false, true}) {
      const std::string what = c.name + (backward ? " backward" : " forward");
      const auto inv = op_inv_freq(c.params);
      EXPECT_LT(max_scaled_err(run(env, c, DType::f32, xf, backward),
                               reference(xf, c.head_dim, c.params, inv, backward)),
                kFloatVsDoubleTol)
          << what;
      EXPECT_LT(max_scaled_err(run(env, c, DType::bf16, xb, backward),
                               reference(xb, c.head_dim, c.params, inv, backward)),
                kBf16VsDoubleTol)
          << what;
    }
  }
}

TEST(RopeScalingOp, Bf16IsTheF32ResultRoundedOnce) {
  OpEnv env;
  uint64_t seed = 370;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto x = rounded_to_bf16(random_vector(kTokens * kHeads * c.head_dim, seed++));
    expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
      std::vector<OwnedTensor> r;
      auto pos = env.indices({kTokens}, DType::i64, kPositions);
      for (bool backward : {false, true}) {
        r.push_back(make_input(env, {kTokens, kHeads, c.head_dim}, dt, x));
        if (backward) {
          ops::rope_backward_cpu(r.back(), pos, c.params, env.stream());
        } else {
          ops::rope_forward_cpu(r.back(), pos, c.params, env.stream());
        }
      }
      env.stream().synchronize();
      return r;
    });
  }
}

}  // namespace
}  // namespace moepeak
