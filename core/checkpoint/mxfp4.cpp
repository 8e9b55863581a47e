// The MXFP4 codec; the format, its exactness and the encoder's choices are in mxfp4.h.
#include "core/checkpoint/mxfp4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace moepeak {

namespace {

constexpr int kNaNScale = 255;
// The least scale at which some code overflows f32: 4 * 2^(253 - 127) = 2^128.
constexpr int kFirstOverflowingScale = 253;
// E2M1's largest exponent: 6 = 1.5 * 2^2 (OCP MX v1.0, emax_elem).
constexpr int kE2m1MaxExponent = 2;
constexpr uint8_t kSignBit = 8;

// kMxfp4Values[code] * 2^(scale - 127) for every scale byte but 255: exact, or inf where it
// overflows f32 (scales 253 and 254 only).
using ScaledValues = std::array<std::array<float, 16>, kNaNScale>;

const ScaledValues& scaled_values() {
  static const ScaledValues table = [] {
    ScaledValues t;
    for (int s = 0; s < kNaNScale; ++s) {
      for (int c = 0; c < 16; ++c) t[s][c] = std::ldexp(kMxfp4Values[c], s - kMxfp4ScaleBias);
    }
    return t;
  }();
  return table;
}

// "(0, 3, 17)": the position of row-major element `flat` of `shape`.
std::string index_text(const Shape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.ndim());
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string s = "(";
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + ")";
}

// The E2M1 code (sign bit clear) nearest to a >= 0, ties to the even code, saturating at 6.
uint8_t e2m1_magnitude_code(double a) {
  // The midpoints between consecutive magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
  static constexpr double kMidpoints[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
  int below = 0;  // midpoints below a: a lies between codes `below` and `below + 1`
  while (below < 7 && kMidpoints[below] < a) ++below;
  // On a midpoint the two candidates are `below` and `below + 1`; the even one wins.
  bool tie_to_next = below < 7 && a == kMidpoints[below] && (below & 1) != 0;
  return static_cast<uint8_t>(below + (tie_to_next ? 1 : 0));
}

}  // namespace

Shape mxfp4_decoded_shape(std::string_view name, const Shape& blocks_shape,
                          const Shape& scales_shape) {
  MOEPEAK_CHECK_INPUT(blocks_shape.ndim() >= 2, "mxfp4 tensor \"", name, "\": blocks shape ",
                      blocks_shape.str(), " has fewer than 2 dims ([..., blocks, 16])");
  MOEPEAK_CHECK_INPUT(blocks_shape[-1] == kMxfp4BytesPerBlock, "mxfp4 tensor \"", name,
                      "\": blocks shape ", blocks_shape.str(), " ends in ", blocks_shape[-1],
                      ", not ", kMxfp4BytesPerBlock, " (bytes per block of 32)");
  bool leading_agree = scales_shape.ndim() == blocks_shape.ndim() - 1;
  for (int d = 0; leading_agree && d < scales_shape.ndim(); ++d) {
    leading_agree = scales_shape[d] == blocks_shape[d];
  }
  MOEPEAK_CHECK_INPUT(leading_agree, "mxfp4 tensor \"", name, "\": scales shape ",
                      scales_shape.str(), " is not blocks shape ", blocks_shape.str(),
                      " without its last dim");
  return scales_shape.with_dim(-1, scales_shape[-1] * kMxfp4BlockSize);
}

void mxfp4_dequantize(std::string_view name, std::span<const uint8_t> blocks,
                      const Shape& blocks_shape, std::span<const uint8_t> scales,
                      const Shape& scales_shape, std::span<float> out) {
  const Shape decoded = mxfp4_decoded_shape(name, blocks_shape, scales_shape);
  MOEPEAK_CHECK(static_cast<int64_t>(blocks.size()) == blocks_shape.numel(), "mxfp4 tensor \"",
                name, "\": ", blocks.size(), " block bytes for shape ", blocks_shape.str());
  MOEPEAK_CHECK(static_cast<int64_t>(scales.size()) == scales_shape.numel(), "mxfp4 tensor \"",
                name, "\": ", scales.size(), " scale bytes for shape ", scales_shape.str());
  MOEPEAK_CHECK(static_cast<int64_t>(out.size()) == decoded.numel(), "mxfp4 tensor \"", name,
                "\": ", out.size(), " output floats for the decoded shape ", decoded.str());

  const ScaledValues& table = scaled_values();
  const int64_t block_count = scales_shape.numel();
  for (int64_t g = 0; g < block_count; ++g) {
    const int scale = scales[g];
    MOEPEAK_CHECK_INPUT(scale != kNaNScale, "mxfp4 tensor \"", name, "\": scale ",
                        index_text(scales_shape, g), " is 255, NaN in E8M0");
    const std::array<float, 16>& values = table[scale];
    const uint8_t* in = blocks.data() + g * kMxfp4BytesPerBlock;
    float* dst = out.data() + g * kMxfp4BlockSize;
    for (int64_t j = 0; j < kMxfp4BytesPerBlock; ++j) {
      dst[2 * j] = values[in[j] & 0xf];
      dst[2 * j + 1] = values[in[j] >> 4];
    }
    if (scale >= kFirstOverflowingScale) {
      for (int64_t i = 0; i < kMxfp4BlockSize; ++i) {
        if (!std::isinf(dst[i])) continue;
        const int code = (in[i / 2] >> (4 * (i % 2))) & 0xf;
        MOEPEAK_INPUT_ERROR("mxfp4 tensor \"", name, "\": element ",
                            index_text(decoded, g * kMxfp4BlockSize + i), " = ", kMxfp4Values[code],
                            " * 2^", scale - kMxfp4ScaleBias, " overflows f32 (scale ", scale,
                            ", code ", code, ")");
      }
    }
  }
}

void mxfp4_quantize(std::string_view name, std::span<const float> values, const Shape& shape,
                    std::span<uint8_t> blocks, std::span<uint8_t> scales) {
  MOEPEAK_CHECK_INPUT(shape.ndim() >= 1 && shape[-1] % kMxfp4BlockSize == 0, "mxfp4 tensor \"",
                      name, "\": shape ", shape.str(), " does not end in a multiple of ",
                      kMxfp4BlockSize);
  const int64_t count = shape.numel();
  MOEPEAK_CHECK(static_cast<int64_t>(values.size()) == count, "mxfp4 tensor \"", name,
                "\": ", values.size(), " values for shape ", shape.str());
  MOEPEAK_CHECK(static_cast<int64_t>(blocks.size()) * 2 == count, "mxfp4 tensor \"", name,
                "\": ", blocks.size(), " block bytes for shape ", shape.str(), "; need ",
                count / 2);
  MOEPEAK_CHECK(static_cast<int64_t>(scales.size()) * kMxfp4BlockSize == count, "mxfp4 tensor \"",
                name, "\": ", scales.size(), " scale bytes for shape ", shape.str(), "; need ",
                count / kMxfp4BlockSize);

  const int64_t block_count = count / kMxfp4BlockSize;
  for (int64_t g = 0; g < block_count; ++g) {
    const float* in = values.data() + g * kMxfp4BlockSize;
    float max_abs = 0.0f;
    for (int64_t i = 0; i < kMxfp4BlockSize; ++i) {
      MOEPEAK_CHECK_INPUT(std::isfinite(in[i]), "mxfp4 tensor \"", name, "\": element ",
                          g * kMxfp4BlockSize + i, " ", index_text(shape, g * kMxfp4BlockSize + i),
                          " is ", in[i], "; MXFP4 holds finite values only");
      max_abs = std::max(max_abs, std::fabs(in[i]));
    }
    // floor(log2(max_abs)) is the unbiased exponent of a normal max_abs; a zero or subnormal one
    // (biased exponent 0) gives an X below -127, which the clamp turns into -127 all the same.
    uint32_t bits;
    std::memcpy(&bits, &max_abs, sizeof bits);
    const int biased_exponent = static_cast<int>(bits >> 23);
    const int shared_exponent =
        std::max(biased_exponent - kMxfp4ScaleBias - kE2m1MaxExponent, -kMxfp4ScaleBias);
    scales[g] = static_cast<uint8_t>(shared_exponent + kMxfp4ScaleBias);

    uint8_t* dst = blocks.data() + g * kMxfp4BytesPerBlock;
    for (int64_t j = 0; j < kMxfp4BytesPerBlock; ++j) {
      uint8_t codes[2];
      for (int k = 0; k < 2; ++k) {
        const float v = in[2 * j + k];
        // Exact: a power-of-two scaling of a float stays well inside double's range.
        const double scaled = std::ldexp(static_cast<double>(std::fabs(v)), -shared_exponent);
        codes[k] =
            static_cast<uint8_t>(e2m1_magnitude_code(scaled) | (std::signbit(v) ? kSignBit : 0));
      }
      dst[j] = static_cast<uint8_t>(codes[0] | (codes[1] << 4));
    }
  }
}

}  // namespace moepeak
