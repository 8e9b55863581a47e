// The RoPE scaling types' host side: a model's rope_scaling fields to the op's RopeParams, with
// transformers' formulas for the scalars (the per-frequency part is rope_inv_freq,
// ops/rope_params.h) and the argument checks (see ops/rope_scaling.h).
#include "ops/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace moepeak::ops {

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::default_:
      return "default";
    case RopeType::linear:
      return "linear";
    case RopeType::dynamic:
      return "dynamic";
    case RopeType::yarn:
      return "yarn";
    case RopeType::llama3:
      return "llama3";
  }
  return "unknown";
}

std::optional<RopeType> rope_type_from_name(std::string_view name) {
  for (RopeType t : {RopeType::default_, RopeType::linear, RopeType::dynamic, RopeType::yarn,
                     RopeType::llama3}) {
    if (name == rope_type_name(t)) return t;
  }
  return std::nullopt;
}

namespace {

constexpr double kPi = 3.14159265358979323846;

// Checks and reads the fields of one scaling; every message names the type and the field.
class Fields {
 public:
  explicit Fields(const RopeScaling& s)
      : s_(s),
        prefix_(std::string("rope_scaling (rope_type \"") + rope_type_name(s.type) + "\"): ") {}

  const std::string& prefix() const { return prefix_; }

  // A required field; finite, and >= `min` (or > `min` when `strict`).
  double required(const std::optional<double>& v, const char* field, double min,
                  bool strict) const {
    MOEPEAK_CHECK_INPUT(v.has_value(), prefix_, "\"", field, "\" is required");
    check(*v, field, min, strict);
    return *v;
  }

  void finite(double v, const char* field) const {
    MOEPEAK_CHECK_INPUT(std::isfinite(v), prefix_, "\"", field, "\" must be finite, got ", v);
  }

  void check(double v, const char* field, double min, bool strict) const {
    MOEPEAK_CHECK_INPUT(std::isfinite(v) && (strict ? v > min : v >= min), prefix_, "\"", field,
                        "\" must be ", strict ? "> " : ">= ", min, ", got ", v);
  }

  // original_max_position_embeddings, max_position_embeddings when absent (transformers'
  // standardize_rope_params).
  double original_max_position(int64_t max_position_embeddings) const {
    const int64_t orig = s_.original_max_position_embeddings.value_or(max_position_embeddings);
    MOEPEAK_CHECK_INPUT(orig > 0, prefix_,
                        s_.original_max_position_embeddings ? "\"original_max_position_embeddings\""
                                                            : "max_position_embeddings",
                        " must be > 0, got ", orig);
    return static_cast<double>(orig);
  }

 private:
  const RopeScaling& s_;
  std::string prefix_;
};

// transformers' get_mscale: 0.1 * mscale * ln(scale) + 1, and 1 for scale <= 1.
double get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' find_correction_dim: the frequency index whose wavelength fits `rotations` times
// into `orig` positions.
double correction_dim(double rotations, double dim, double base, double orig) {
  return (dim * std::log(orig / (rotations * 2.0 * kPi))) / (2.0 * std::log(base));
}

void set_yarn(const RopeScaling& s, const Fields& f, int64_t max_position_embeddings,
              RopeParams& p) {
  const double orig = f.original_max_position(max_position_embeddings);
  double factor;
  if (s.factor) {
    factor = f.required(s.factor, "factor", 1.0, false);
  } else {
    // transformers 5: factor = max_position_embeddings / original_max_position_embeddings.
    MOEPEAK_CHECK_INPUT(s.original_max_position_embeddings.has_value(), f.prefix(),
                        "\"factor\" is required (or \"original_max_position_embeddings\", with"
                        " factor = max_position_embeddings / original_max_position_embeddings)");
    factor = static_cast<double>(max_position_embeddings) / orig;
    MOEPEAK_CHECK_INPUT(factor >= 1.0, f.prefix(), "without \"factor\", max_position_embeddings (",
                        max_position_embeddings, ") / \"original_max_position_embeddings\" (", orig,
                        ") must be >= 1");
  }
  // transformers' `get("beta_fast") or 32`: absent and 0 both mean the default.
  const double beta_fast = s.beta_fast.value_or(0.0) != 0.0 ? *s.beta_fast : 32.0;
  const double beta_slow = s.beta_slow.value_or(0.0) != 0.0 ? *s.beta_slow : 1.0;
  f.check(beta_slow, "beta_slow", 0.0, true);
  f.check(beta_fast, "beta_fast", 0.0, true);
  MOEPEAK_CHECK_INPUT(beta_fast >= beta_slow, f.prefix(), "\"beta_fast\" (", beta_fast,
                      ") must be >= \"beta_slow\" (", beta_slow, ")");

  double attention_factor;
  if (s.attention_factor) {
    attention_factor = f.required(s.attention_factor, "attention_factor", 0.0, true);
  } else if (s.mscale.value_or(0.0) != 0.0 && s.mscale_all_dim.value_or(0.0) != 0.0) {
    f.finite(*s.mscale, "mscale");
    f.finite(*s.mscale_all_dim, "mscale_all_dim");
    attention_factor = get_mscale(factor, *s.mscale) / get_mscale(factor, *s.mscale_all_dim);
    MOEPEAK_CHECK_INPUT(std::isfinite(attention_factor) && attention_factor > 0.0, f.prefix(),
                        "the attention factor get_mscale(factor, mscale) / get_mscale(factor,"
                        " mscale_all_dim) must be > 0, got ",
                        attention_factor, " (factor ", factor, ", mscale ", *s.mscale,
                        ", mscale_all_dim ", *s.mscale_all_dim, ")");
  } else {
    attention_factor = get_mscale(factor, 1.0);
  }

  // transformers' find_correction_range and linear_ramp_factor, in double.
  const double dim = static_cast<double>(p.rotary_dim);
  double low = correction_dim(beta_fast, dim, p.base, orig);
  double high = correction_dim(beta_slow, dim, p.base, orig);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // transformers: "Prevent singularity"

  p.factor = factor;
  p.ramp_low = low;
  p.ramp_high = high;
  p.attention_factor = attention_factor;
}

void set_llama3(const RopeScaling& s, const Fields& f, int64_t max_position_embeddings,
                RopeParams& p) {
  p.factor = f.required(s.factor, "factor", 1.0, false);
  const double low = f.required(s.low_freq_factor, "low_freq_factor", 0.0, true);
  const double high = f.required(s.high_freq_factor, "high_freq_factor", 0.0, true);
  MOEPEAK_CHECK_INPUT(high > low, f.prefix(), "\"high_freq_factor\" (", high,
                      ") must be > \"low_freq_factor\" (", low, ")");
  const double orig = f.original_max_position(max_position_embeddings);
  p.original_max_position = orig;
  p.low_freq_factor = low;
  p.high_freq_factor = high;
  p.low_freq_wavelen = orig / low;
  p.high_freq_wavelen = orig / high;
}

}  // namespace

RopeParams rope_params(const RopeScaling& scaling, double theta, int64_t rotary_dim,
                       int64_t max_position_embeddings, int64_t seq_len, bool interleaved) {
  const Fields f(scaling);
  MOEPEAK_CHECK_INPUT(std::isfinite(theta) && theta > 0.0, f.prefix(),
                      "rope_theta must be > 0, got ", theta);
  MOEPEAK_CHECK_INPUT(rotary_dim > 0 && rotary_dim % 2 == 0, f.prefix(),
                      "the rotary dimension must be even and > 0 (RoPE rotates pairs), got ",
                      rotary_dim);
  RopeParams p = RopeParams::standard(theta, rotary_dim);
  p.type = scaling.type;
  p.interleaved = interleaved;
  switch (scaling.type) {
    case RopeType::default_:
      break;
    case RopeType::linear:
      p.factor = f.required(scaling.factor, "factor", 1.0, false);
      break;
    case RopeType::dynamic: {
      const double factor = f.required(scaling.factor, "factor", 1.0, false);
      MOEPEAK_CHECK_INPUT(rotary_dim > 2, f.prefix(),
                          "the rotary dimension must be > 2 (the base's exponent is dim / (dim - "
                          "2)), got ",
                          rotary_dim);
      MOEPEAK_CHECK_INPUT(max_position_embeddings > 0, f.prefix(),
                          "max_position_embeddings must be > 0, got ", max_position_embeddings);
      MOEPEAK_CHECK_INPUT(seq_len >= 0, f.prefix(), "the sequence length must be >= 0, got ",
                          seq_len);
      if (seq_len > max_position_embeddings) {
        const double dim = static_cast<double>(rotary_dim);
        p.base = theta * std::pow(factor * static_cast<double>(seq_len) /
                                          static_cast<double>(max_position_embeddings) -
                                      (factor - 1.0),
                                  dim / (dim - 2.0));
      }
      break;
    }
    case RopeType::yarn:
      set_yarn(scaling, f, max_position_embeddings, p);
      break;
    case RopeType::llama3:
      set_llama3(scaling, f, max_position_embeddings, p);
      break;
    default:
      MOEPEAK_INPUT_ERROR("rope_scaling: unknown rope_type ", static_cast<int>(scaling.type));
  }
  return p;
}

}  // namespace moepeak::ops
