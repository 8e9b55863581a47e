// FP8 block-scaled weights (core/checkpoint/fp8.h), as DeepSeek-V3 and Kimi-K2 are released:
// every float8_e4m3fn code against a decoding from its bit fields written here in float64 with
// other arithmetic (powers by repeated multiplication), the blockwise product against a float64
// reference rounded once to fp32, partial edge blocks, exactness in bf16, and the errors.
// Run: ctest -R test_fp8
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/checkpoint/fp8.h"
#include "core/error.h"
#include "core/runtime/dtype.h"
#include "tests/expect_contains.h"

namespace moepeak {
namespace {

using test_support::error_of;

// float8_e4m3fn from its fields, in double: sign, exponent e (bias 7), mantissa m; e = 0 is
// subnormal; e = 15 with m = 7 is NaN (no infinities).
double e4m3fn_reference(uint8_t code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double scale = 1;
  const int exponent = e == 0 ? -6 : e - 7;
  for (int k = 0; k < std::abs(exponent); ++k) scale = exponent > 0 ? scale * 2 : scale / 2;
  const double v = (e == 0 ? m / 8.0 : 1 + m / 8.0) * scale;
  return sign ? -v : v;
}

TEST(Fp8, EveryCodeDecodesExactly) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3fn_reference(static_cast<uint8_t>(c));
    const float got = fp8_e4m3fn_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 is 0x80
    // At most 4 significant bits: exact in bf16 too.
    EXPECT_EQ(bf16::to_float(bf16::from_float(got)), got) << "code " << c;
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF
  EXPECT_EQ(fp8_e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x01), std::ldexp(1.0f, -9));  // the least subnormal
  EXPECT_EQ(fp8_e4m3fn_to_float(0x08), std::ldexp(1.0f, -6));  // the least normal
  EXPECT_EQ(fp8_e4m3fn_to_float(0x38), 1.0f);
}

// Random codes (NaN excluded) and scales, a shape with partial blocks at both edges.
TEST(Fp8, BlockProductIsTheFp32RoundingOfTheExactProduct) {
  for (const Fp8Block block : {Fp8Block{4, 8}, Fp8Block{128, 128}, Fp8Block{3, 1}}) {
    const int64_t rows = 11, cols = 21;  // 11 = 2*4 + 3, 21 = 2*8 + 5
    const int64_t sr = fp8_scale_rows(rows, block), sc = fp8_scale_cols(cols, block);
    EXPECT_EQ(sr, (rows + block.rows - 1) / block.rows);
    std::mt19937 rng(static_cast<unsigned>(block.rows * 100 + block.cols));
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    for (auto& c : codes) {
      do {
        c = static_cast<uint8_t>(rng() & 0xFF);
      } while ((c & 0x7F) == 0x7F);
    }
    std::vector<float> scales(static_cast<size_t>(sr * sc));
    std::uniform_real_distribution<float> u(1e-4f, 3.0f);
    for (auto& s : scales) s = u(rng);
    std::vector<float> out(codes.size(), std::numeric_limits<float>::quiet_NaN());
    fp8_block_dequantize("w", codes, rows, cols, scales, block, out);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const size_t at = static_cast<size_t>(i * cols + j);
        const double exact =
            e4m3fn_reference(codes[at]) *
            static_cast<double>(
                scales[static_cast<size_t>((i / block.rows) * sc + j / block.cols)]);
        ASSERT_EQ(out[at], static_cast<float>(exact))
            << "(" << i << ", " << j << ") blocks " << block.rows << "x" << block.cols;
      }
    }
  }
  // No elements: nothing to do.
  std::vector<float> none;
  fp8_block_dequantize("w", {}, 0, 5, std::vector<float>{}, Fp8Block{}, none);
}

TEST(Fp8, BadInputNamesTheTensor) {
  const std::vector<uint8_t> codes(6, 0x38);
  std::vector<float> out(6);
  const std::vector<float> one{1.0f};
  EXPECT_CONTAINS(
      error_of([&] {
        fp8_block_dequantize("q_b_proj.weight", codes, 2, 3, std::vector<float>{1, 2, 3},
                             Fp8Block{2, 2}, out);
      }),
      "q_b_proj.weight_scale_inv\": 3 scales, but (2, 3) in blocks of [2, 2] needs (1, 2)");
  EXPECT_CONTAINS(
      error_of([&] {
        fp8_block_dequantize("w", std::vector<uint8_t>(5), 2, 3, one, Fp8Block{2, 3}, out);
      }),
      "tensor \"w\": 5 FP8 codes for shape (2, 3)");
  EXPECT_CONTAINS(error_of([&] {
                    fp8_block_dequantize("w", codes, 2, 3, one, Fp8Block{0, 3}, out);
                  }),
                  "weight_block_size [0, 3] must be positive");
  EXPECT_CONTAINS(
      error_of([&] {
        fp8_block_dequantize("w", codes, 2, 3, std::vector<float>{-1.0f}, Fp8Block{2, 3}, out);
      }),
      "w_scale_inv\": block (0, 0) has scale -1");
  std::vector<uint8_t> nan = codes;
  nan[4] = 0xFF;
  EXPECT_CONTAINS(error_of([&] {
                    fp8_block_dequantize("w", nan, 2, 3, one, Fp8Block{2, 3}, out);
                  }),
                  "tensor \"w\": element (1, 1) is 0xFF, float8_e4m3fn's NaN");
}

}  // namespace
}  // namespace moepeak
