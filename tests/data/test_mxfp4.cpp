// Tests of the MXFP4 codec (core/checkpoint/mxfp4.h): every code in both nibbles of a byte at
// scales across E8M0's range (0 and 254 included) against E2M1 decoded from its bit fields in
// float64; decoded values exact in bf16; random packed tensors decoded and re-encoded (bytes
// equal where the format fixes them, values equal everywhere); quantisation of random floats
// against a float64 OCP MX rounding written here (nearest, ties to the even code, saturation, a
// power-of-two max, maxima below 2^-127, zeros of both signs); and the errors, each naming the
// tensor: mismatched shapes, spans of the wrong size, scale 255, f32 overflow, NaN and inf.
//     ctest -R test_mxfp4 --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/checkpoint/mxfp4.h"
#include "core/error.h"
#include "core/runtime/dtype.h"
#include "core/runtime/tensor.h"
#include "tests/expect_contains.h"

namespace moepeak {
namespace {

using test_support::error_of;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// An E2M1 code decoded from its fields (sign bit 3, exponent bits 2..1 with bias 1, mantissa
// bit 0; exponent 0 is subnormal), independently of kMxfp4Values.
double e2m1_value(int code) {
  const int exponent = (code >> 1) & 3;
  const int mantissa = code & 1;
  const double magnitude =
      exponent == 0 ? 0.5 * mantissa : (1.0 + 0.5 * mantissa) * std::ldexp(1.0, exponent - 1);
  return (code & 8) ? -magnitude : magnitude;
}

// The float64 value of `code` at E8M0 scale byte `scale`.
double decoded_value(int code, int scale) { return e2m1_value(code) * std::pow(2.0, scale - 127); }

// ---- the OCP MX v1.0 encoding, in float64, as the spec words it ----------------------------

// The nearest of E2M1's magnitudes to q >= 0 by distance, a tie going to the even code, and any
// q beyond 6 to 6 (saturation).
int reference_magnitude_code(double q) {
  int best = 0;
  for (int code = 1; code < 8; ++code) {
    const double d = std::fabs(q - e2m1_value(code));
    const double best_d = std::fabs(q - e2m1_value(best));
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return best;
}

// Encodes one block of 32 into (scale byte, 32 codes): X = floor(log2(max|v|)) - emax_elem (2),
// clamped to E8M0's least (-127; a zero max has log2 = -inf).
void reference_encode_block(const float* v, uint8_t* scale, uint8_t codes[32]) {
  double max_abs = 0;
  for (int i = 0; i < 32; ++i) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v[i])));
  int x = -127;
  if (max_abs > 0) {
    int e;
    std::frexp(max_abs, &e);  // max_abs = f * 2^e, f in [0.5, 1): floor(log2) = e - 1
    x = std::max(e - 1 - 2, -127);
  }
  *scale = static_cast<uint8_t>(x + 127);
  for (int i = 0; i < 32; ++i) {
    const double q = std::fabs(static_cast<double>(v[i])) / std::pow(2.0, x);
    codes[i] = static_cast<uint8_t>(reference_magnitude_code(q) | (std::signbit(v[i]) ? 8 : 0));
  }
}

int code_at(const std::vector<uint8_t>& blocks, int64_t element) {
  return (blocks[element / 2] >> (4 * (element % 2))) & 0xf;
}

// ---- decode -------------------------------------------------------------------------------

TEST(Mxfp4Decode, EveryCodeInBothNibblesAtScalesAcrossTheRange) {
  // Every byte value once per scale: 256 bytes = 16 blocks of 16, so each code sits in the low
  // (even element) and the high (odd element) nibble beside every other code.
  for (int scale : {0, 1, 2, 100, 126, 127, 128, 200, 252}) {
    std::vector<uint8_t> blocks(256);
    for (int b = 0; b < 256; ++b) blocks[b] = static_cast<uint8_t>(b);
    std::vector<uint8_t> scales(16, static_cast<uint8_t>(scale));
    std::vector<float> out(512, kNaN);  // poisoned: every element must be written
    mxfp4_dequantize("w", blocks, {16, 16}, scales, {16}, out);
    for (int b = 0; b < 256; ++b) {
      for (int half = 0; half < 2; ++half) {
        const int code = half == 0 ? (b & 0xf) : (b >> 4);
        // Exact in float64, and representable in f32 up to scale 252 (6 * 2^125).
        const float expected = static_cast<float>(decoded_value(code, scale));
        ASSERT_EQ(static_cast<double>(expected), decoded_value(code, scale));
        EXPECT_EQ(bits_of(out[2 * b + half]), bits_of(expected))
            << "scale " << scale << " byte " << b << " nibble " << half << ": " << out[2 * b + half]
            << " != " << expected;
      }
    }
  }
}

TEST(Mxfp4Decode, TheLargestScalesDecodeWhatFitsF32AndRefuseWhatOverflows) {
  // 2^(253 - 127) * {.5, 1, 1.5, 2, 3} fit f32 (its max is just under 2^128); 4 and 6 do not.
  // At 254 only .5, 1 and 1.5 fit.
  for (int scale : {253, 254}) {
    for (int code = 0; code < 16; ++code) {
      std::vector<uint8_t> blocks(16, 0);
      blocks[5] = static_cast<uint8_t>(code << 4);  // element 11
      std::vector<uint8_t> scales = {static_cast<uint8_t>(scale)};
      std::vector<float> out(32, kNaN);
      const double value = decoded_value(code, scale);
      if (std::fabs(value) <= std::numeric_limits<float>::max()) {
        mxfp4_dequantize("w", blocks, {1, 16}, scales, {1}, out);
        EXPECT_EQ(static_cast<double>(out[11]), value) << "scale " << scale << " code " << code;
        EXPECT_EQ(bits_of(out[10]), bits_of(0.0f));
      } else {
        const std::string e = error_of([&] {
          mxfp4_dequantize("w.down", blocks, {1, 16}, scales, {1}, out);
        });
        EXPECT_CONTAINS(e, "\"w.down\"");
        EXPECT_CONTAINS(e, "element (11) = ");
        EXPECT_CONTAINS(e, "overflows f32");
      }
    }
  }
}

TEST(Mxfp4Decode, EveryDecodedValueIsExactInBf16) {
  // bf16 has f32's 8 exponent bits (subnormals down to 2^-133) and 7 mantissa bits; a code has
  // at most 2 significant bits, so rounding to bf16 must change nothing, 2^-128 included.
  std::vector<uint8_t> blocks(16);
  for (int j = 0; j < 16; ++j) blocks[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  for (int scale = 0; scale <= 252; ++scale) {
    std::vector<uint8_t> scales = {static_cast<uint8_t>(scale)};
    std::vector<float> out(32, kNaN);
    mxfp4_dequantize("w", blocks, {1, 16}, scales, {1}, out);
    for (int i = 0; i < 32; ++i) {
      const float through_bf16 = bf16::to_float(bf16::from_float(out[i]));
      ASSERT_EQ(bits_of(through_bf16), bits_of(out[i])) << "scale " << scale << " element " << i;
    }
  }
  // The smallest nonzero value: 0.5 * 2^-127, a subnormal of both.
  std::vector<uint8_t> scales = {0};
  std::vector<float> out(32, kNaN);
  mxfp4_dequantize("w", blocks, {1, 16}, scales, {1}, out);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -128));  // byte 1: low nibble code 1
}

TEST(Mxfp4Decode, ShapesWithAnyNumberOfLeadingDims) {
  // gpt-oss: gate_up_proj blocks [E, 2I, H/32, 16] -> [E, 2I, H], down_proj [E, H, I/32, 16].
  EXPECT_EQ(mxfp4_decoded_shape("g", {4, 64, 3, 16}, {4, 64, 3}), Shape({4, 64, 96}));
  EXPECT_EQ(mxfp4_decoded_shape("g", {2, 16}, {2}), Shape({64}));
  EXPECT_EQ(mxfp4_decoded_shape("g", {1, 2, 3, 4, 5, 16}, {1, 2, 3, 4, 5}),
            Shape({1, 2, 3, 4, 160}));
  EXPECT_EQ(mxfp4_decoded_shape("g", {0, 7, 2, 16}, {0, 7, 2}), Shape({0, 7, 64}));
  // Row-major: element (e, r, c) of [2, 3, 64] is block (e, r, c / 32), byte (c % 32) / 2.
  std::mt19937 rng(7);
  std::vector<uint8_t> blocks(2 * 3 * 2 * 16), scales(2 * 3 * 2);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(100 + rng() % 50);
  std::vector<float> out(2 * 3 * 64, kNaN);
  mxfp4_dequantize("w", blocks, {2, 3, 2, 16}, scales, {2, 3, 2}, out);
  for (int e = 0; e < 2; ++e) {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 64; ++c) {
        const int block = (e * 3 + r) * 2 + c / 32;
        const int code = (blocks[block * 16 + (c % 32) / 2] >> (4 * (c % 2))) & 0xf;
        EXPECT_EQ(static_cast<double>(out[(e * 3 + r) * 64 + c]),
                  decoded_value(code, scales[block]));
      }
    }
  }
}

// ---- round trip ---------------------------------------------------------------------------

TEST(Mxfp4RoundTrip, RandomPackedTensorsDecodeAndReencode) {
  // Random bytes and scales in [0, 252]; most blocks hold a code of magnitude 4 or 6 (then the
  // bytes must come back), some only smaller ones, some only zero codes, some scale 0. Every
  // block's values must come back bit for bit; its bytes exactly when its scale is 0 or its
  // largest code is +-4 or +-6 (mxfp4.h); otherwise the scale must come back smaller (a block
  // of zero codes: 0).
  std::mt19937 rng(2024);
  const Shape blocks_shape{3, 5, 8, 16}, scales_shape{3, 5, 8};
  const int64_t block_count = scales_shape.numel();
  std::vector<uint8_t> blocks(blocks_shape.numel()), scales(block_count);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (int64_t g = 0; g < block_count; ++g) {
    scales[g] = static_cast<uint8_t>(rng() % 253);
    const int kind = static_cast<int>(rng() % 8);
    uint8_t* block = blocks.data() + g * 16;
    if (kind == 0) {
      for (int j = 0; j < 16; ++j) block[j] &= 0x88;  // zero codes of either sign
    } else if (kind == 1) {
      scales[g] = 0;
    } else if (kind < 6) {
      const int at = static_cast<int>(rng() % 32);  // a 4 or 6 at least here
      const uint8_t code = static_cast<uint8_t>((rng() % 2 ? 6 : 7) | (rng() % 2 ? 8 : 0));
      uint8_t& byte = block[at / 2];
      byte = at % 2 ? static_cast<uint8_t>((byte & 0x0f) | (code << 4))
                    : static_cast<uint8_t>((byte & 0xf0) | code);
    } else if (kind == 6) {
      for (int j = 0; j < 16; ++j) block[j] &= 0xdd;  // codes of 0, .5, 2, 3
    } else {
      for (int j = 0; j < 16; ++j) block[j] &= 0xbb;  // codes of 0, .5, 1, 1.5
    }
  }
  const Shape shape = mxfp4_decoded_shape("w", blocks_shape, scales_shape);
  std::vector<float> values(shape.numel(), kNaN);
  mxfp4_dequantize("w", blocks, blocks_shape, scales, scales_shape, values);

  std::vector<uint8_t> blocks2(blocks.size(), 0xa5), scales2(scales.size(), 0xa5);
  mxfp4_quantize("w", values, shape, blocks2, scales2);
  std::vector<float> values2(values.size(), kNaN);
  mxfp4_dequantize("w", blocks2, blocks_shape, scales2, scales_shape, values2);

  int same_bytes = 0, rescaled = 0, zero_blocks_rescaled = 0;
  for (int64_t g = 0; g < block_count; ++g) {
    int largest = 0;
    for (int i = 0; i < 32; ++i) largest = std::max(largest, code_at(blocks, g * 32 + i) & 7);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(bits_of(values2[g * 32 + i]), bits_of(values[g * 32 + i]))
          << "block " << g << " element " << i;
    }
    const bool bytes_fixed = scales[g] == 0 || largest >= 6;
    const bool bytes_equal =
        scales2[g] == scales[g] &&
        std::equal(blocks.begin() + g * 16, blocks.begin() + g * 16 + 16, blocks2.begin() + g * 16);
    EXPECT_EQ(bytes_equal, bytes_fixed)
        << "block " << g << " scale " << int{scales[g]} << " largest code " << largest;
    if (bytes_fixed) {
      ++same_bytes;
    } else {
      EXPECT_LT(scales2[g], scales[g]) << "block " << g;
      if (largest == 0) {
        EXPECT_EQ(scales2[g], 0) << "block " << g;
        ++zero_blocks_rescaled;
      }
      ++rescaled;
    }
  }
  // Each kind of block occurred.
  EXPECT_GT(same_bytes, 0);
  EXPECT_GT(rescaled, 0);
  EXPECT_GT(zero_blocks_rescaled, 0);
}

// ---- encode -------------------------------------------------------------------------------

// Quantises `values` ([blocks * 32]) with mxfp4_quantize and the float64 reference and expects
// the same bytes.
void expect_matches_reference(const std::vector<float>& values, const char* what) {
  const int64_t count = static_cast<int64_t>(values.size());
  std::vector<uint8_t> blocks(count / 2, 0x5a), scales(count / 32, 0x5a);
  mxfp4_quantize("w", values, {count / 32, 32}, blocks, scales);
  for (int64_t g = 0; g < count / 32; ++g) {
    uint8_t scale, codes[32];
    reference_encode_block(values.data() + g * 32, &scale, codes);
    EXPECT_EQ(scales[g], scale) << what << ": block " << g;
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(code_at(blocks, g * 32 + i), codes[i])
          << what << ": block " << g << " element " << i << " = " << values[g * 32 + i]
          << " (scale " << int{scale} << ")";
    }
  }
}

TEST(Mxfp4Encode, RandomFloatsMatchTheFloat64Reference) {
  // Blocks at magnitudes from f32's subnormals to near its max, normal and uniform values,
  // off-centre so that signs and magnitudes mix.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.3f, 1.7f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values;
  for (int g = 0; g < 400; ++g) {
    const int exponent = static_cast<int>(rng() % 262) - 145;  // [-145, 116]
    for (int i = 0; i < 32; ++i) {
      const float v = g % 2 ? normal(rng) : uniform(rng);
      values.push_back(std::ldexp(v, exponent));
    }
  }
  expect_matches_reference(values, "random");
}

TEST(Mxfp4Encode, TiesGoToTheEvenCodeAndLargeValuesSaturate) {
  // Max 32 = 4 * 2^3, a power of two: X = floor(log2 32) - 2 = 3, and each other value / 2^3
  // is one of the midpoints between E2M1 magnitudes, of both signs.
  const double x = 8.0;
  const std::vector<std::pair<double, int>> ties = {{0.25, 0}, {0.75, 2}, {1.25, 2}, {1.75, 4},
                                                    {2.5, 4},  {3.5, 6},  {5.0, 6}};
  std::vector<float> block(32, 0.0f);
  block[0] = static_cast<float>(4 * x);
  for (size_t k = 0; k < ties.size(); ++k) {
    block[1 + 2 * k] = static_cast<float>(ties[k].first * x);
    block[2 + 2 * k] = static_cast<float>(-ties[k].first * x);
  }
  // Just off the ties, and within (6, 8) * 2^X (saturates to 6).
  block[20] = std::nextafter(0.25f * 8, 100.0f);  // just above the tie -> 0.5
  block[21] = std::nextafter(5.0f * 8, 0.0f);     // just below the tie -> 4
  block[22] = -0.0f;                              // -> code 8
  block[23] = -0.1f * 8;                          // -> -0, code 8
  std::vector<float> saturating(32, 1.0f);
  saturating[3] = 7.99f;   // max: floor(log2) = 2, X = 0; 7.99 -> 6
  saturating[4] = -6.5f;   // -> -6
  saturating[5] = 5.0f;    // tie -> 4
  saturating[6] = 5.001f;  // -> 6
  std::vector<float> values = block;
  values.insert(values.end(), saturating.begin(), saturating.end());
  expect_matches_reference(values, "ties");

  // The same bytes spelled out, so the reference itself is checked.
  std::vector<uint8_t> blocks(32), scales(2);
  mxfp4_quantize("w", values, {64}, blocks, scales);
  EXPECT_EQ(scales[0], 127 + 3);
  EXPECT_EQ(code_at(blocks, 0), 6);
  for (size_t k = 0; k < ties.size(); ++k) {
    EXPECT_EQ(code_at(blocks, 1 + 2 * k), ties[k].second) << ties[k].first;
    EXPECT_EQ(code_at(blocks, 2 + 2 * k), ties[k].second | 8) << -ties[k].first;
  }
  EXPECT_EQ(code_at(blocks, 20), 1);
  EXPECT_EQ(code_at(blocks, 21), 6);
  EXPECT_EQ(code_at(blocks, 22), 8);
  EXPECT_EQ(code_at(blocks, 23), 8);
  EXPECT_EQ(scales[1], 127);
  EXPECT_EQ(code_at(blocks, 32 + 3), 7);
  EXPECT_EQ(code_at(blocks, 32 + 4), 15);
  EXPECT_EQ(code_at(blocks, 32 + 5), 6);
  EXPECT_EQ(code_at(blocks, 32 + 6), 7);
  EXPECT_EQ(code_at(blocks, 32 + 0), 2);  // 1.0
}

TEST(Mxfp4Encode, APowerOfTwoMaxIsCodeFourAtItsExponentMinusTwo) {
  for (int e : {-125, -60, -1, 0, 1, 2, 3, 50, 127}) {
    std::vector<float> block(32);
    for (int i = 0; i < 32; ++i) block[i] = std::ldexp(static_cast<float>(i % 7) / 8, e);
    block[9] = -std::ldexp(1.0f, e);  // the max, negative
    std::vector<uint8_t> blocks(16), scales(1);
    mxfp4_quantize("w", block, {32}, blocks, scales);
    EXPECT_EQ(scales[0], e - 2 + 127) << "2^" << e;
    EXPECT_EQ(code_at(blocks, 9), 6 | 8) << "2^" << e;
    expect_matches_reference(block, "power of two");
  }
}

TEST(Mxfp4Encode, MaximaBelowTwoToTheMinus127ClampToScaleZero) {
  // X would be below -127: the scale clamps to byte 0 (2^-127) and the values round there, so
  // 1.5 * 2^-128 = 0.75 * 2^-127 is a tie going to 1 (code 2) and 2^-130 = 0.125 rounds to 0.
  std::vector<float> block(32, 0.0f);
  block[0] = std::ldexp(1.5f, -128);
  block[1] = -std::ldexp(1.0f, -130);
  block[2] = std::ldexp(1.0f, -128);                    // 0.5 -> code 1
  block[3] = std::numeric_limits<float>::denorm_min();  // -> 0
  std::vector<uint8_t> blocks(16), scales(1, 0xff);
  mxfp4_quantize("w", block, {32}, blocks, scales);
  EXPECT_EQ(scales[0], 0);
  EXPECT_EQ(code_at(blocks, 0), 2);
  EXPECT_EQ(code_at(blocks, 1), 8);
  EXPECT_EQ(code_at(blocks, 2), 1);
  EXPECT_EQ(code_at(blocks, 3), 0);
  expect_matches_reference(block, "below 2^-127");
  // The largest max that still clamps: just under 2^-125 (floor(log2) = -126, X = -128).
  block[4] = std::nextafter(std::ldexp(1.0f, -125), 0.0f);
  mxfp4_quantize("w", block, {32}, blocks, scales);
  EXPECT_EQ(scales[0], 0);
  expect_matches_reference(block, "just below 2^-125");
}

TEST(Mxfp4Encode, ZeroBlocksGetScaleZeroAndKeepTheSignOfZero) {
  std::vector<float> zeros(64, 0.0f);
  for (int i = 0; i < 64; i += 3) zeros[i] = -0.0f;
  std::vector<uint8_t> blocks(32, 0x77), scales(2, 0x77);
  mxfp4_quantize("w", zeros, {2, 32}, blocks, scales);
  EXPECT_EQ(scales[0], 0);
  EXPECT_EQ(scales[1], 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(code_at(blocks, i), i % 3 == 0 ? 8 : 0) << i;
  std::vector<float> back(64, kNaN);
  mxfp4_dequantize("w", blocks, {2, 16}, scales, {2}, back);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(bits_of(back[i]), bits_of(zeros[i])) << i;
}

// ---- errors -------------------------------------------------------------------------------

TEST(Mxfp4Errors, MismatchedShapesNameTheTensor) {
  const std::string name = "model.layers.3.mlp.experts.gate_up_proj";
  auto shape_error = [&](const Shape& blocks, const Shape& scales) {
    return error_of([&] { mxfp4_decoded_shape(name, blocks, scales); });
  };
  std::string e = shape_error({4, 8, 3, 16}, {4, 9, 3});  // leading dims differ
  EXPECT_CONTAINS(e, name);
  EXPECT_CONTAINS(e, "(4, 9, 3)");
  EXPECT_CONTAINS(e, "(4, 8, 3, 16)");
  e = shape_error({4, 8, 3, 16}, {4, 8, 2});  // block counts differ
  EXPECT_CONTAINS(e, name);
  EXPECT_CONTAINS(e, "(4, 8, 2)");
  e = shape_error({4, 8, 3, 16}, {4, 8});  // a dim short
  EXPECT_CONTAINS(e, "(4, 8)");
  e = shape_error({4, 8, 3, 16}, {4, 8, 3, 1});  // a dim too many
  EXPECT_CONTAINS(e, "(4, 8, 3, 1)");
  e = shape_error({4, 8, 3, 8}, {4, 8, 3});  // last dim of blocks != 16
  EXPECT_CONTAINS(e, name);
  EXPECT_CONTAINS(e, "ends in 8, not 16");
  e = shape_error({16}, {});  // no block dim
  EXPECT_CONTAINS(e, "fewer than 2 dims");
  // dequantize checks the same.
  std::vector<uint8_t> blocks(4 * 16), scales(4);
  std::vector<float> out(128);
  e = error_of([&] { mxfp4_dequantize(name, blocks, {2, 2, 16}, scales, {4, 1}, out); });
  EXPECT_CONTAINS(e, name);
}

TEST(Mxfp4Errors, SpansOfTheWrongSizeNameTheTensor) {
  std::vector<uint8_t> blocks(2 * 3 * 16), scales(2 * 3);
  std::vector<float> out(2 * 3 * 32);
  const Shape bs{2, 3, 16}, ss{2, 3};
  auto span_error = [&](size_t blocks_size, size_t scales_size, size_t out_size) {
    return error_of([&] {
      mxfp4_dequantize("w.blocks_test", std::span(blocks).first(blocks_size), bs,
                       std::span(scales).first(scales_size), ss, std::span(out).first(out_size));
    });
  };
  EXPECT_CONTAINS(span_error(blocks.size() - 1, scales.size(), out.size()), "w.blocks_test");
  EXPECT_CONTAINS(span_error(blocks.size(), scales.size() - 1, out.size()), "scale bytes");
  EXPECT_CONTAINS(span_error(blocks.size(), scales.size(), out.size() - 1), "output floats");

  std::vector<float> values(2 * 3 * 32, 1.0f);
  auto encode_error = [&](size_t values_size, size_t blocks_size, size_t scales_size) {
    return error_of([&] {
      mxfp4_quantize("w.q", std::span<const float>(values).first(values_size), {2, 3, 32},
                     std::span(blocks).first(blocks_size), std::span(scales).first(scales_size));
    });
  };
  EXPECT_CONTAINS(encode_error(values.size() - 1, blocks.size(), scales.size()), "\"w.q\"");
  EXPECT_CONTAINS(encode_error(values.size(), blocks.size() - 1, scales.size()), "block bytes");
  EXPECT_CONTAINS(encode_error(values.size(), blocks.size(), scales.size() - 1), "scale bytes");
  const std::string e = error_of([&] {
    mxfp4_quantize("w.q", std::span<const float>(values).first(2 * 3 * 16), {2, 3, 16},
                   std::span(blocks).first(48), std::span(scales).first(3));
  });
  EXPECT_CONTAINS(e, "\"w.q\"");
  EXPECT_CONTAINS(e, "multiple of 32");
}

TEST(Mxfp4Errors, Scale255IsNaNAndNamesTheBlock) {
  std::vector<uint8_t> blocks(2 * 3 * 16, 0x21), scales(2 * 3, 127);
  scales[4] = 255;  // block (1, 1)
  std::vector<float> out(2 * 3 * 32);
  const std::string e = error_of([&] {
    mxfp4_dequantize("experts.down_proj", blocks, {2, 3, 16}, scales, {2, 3}, out);
  });
  EXPECT_CONTAINS(e, "\"experts.down_proj\"");
  EXPECT_CONTAINS(e, "scale (1, 1) is 255");
}

TEST(Mxfp4Errors, NaNAndInfiniteValuesNameTheirIndex) {
  for (float bad : {kNaN, kInf, -kInf}) {
    std::vector<float> values(2 * 64, 0.5f);
    values[64 + 37] = bad;  // element (1, 37)
    std::vector<uint8_t> blocks(64), scales(4);
    const std::string e = error_of([&] {
      mxfp4_quantize("experts.gate_up_proj", values, {2, 64}, blocks, scales);
    });
    EXPECT_CONTAINS(e, "\"experts.gate_up_proj\"");
    EXPECT_CONTAINS(e, "element 101 (1, 37)");
  }
}

}  // namespace
}  // namespace moepeak
