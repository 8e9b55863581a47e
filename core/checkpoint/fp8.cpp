// FP8 block-scaled weights: exact float8_e4m3fn decoding and the blockwise fp32 product (see
// fp8.h).
#include "core/checkpoint/fp8.h"

#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace moepeak {
namespace {

// Every code's value, built once from the bit fields with ldexp (exact: at most 4 significant
// bits, exponents -9..8).
const std::array<float, 256>& e4m3fn_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) {
      const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
      float v;
      if (exponent == 0xF && mantissa == 0x7) {
        v = std::numeric_limits<float>::quiet_NaN();
      } else if (exponent == 0) {
        v = std::ldexp(static_cast<float>(mantissa), -9);  // m/8 * 2^-6
      } else {
        v = std::ldexp(static_cast<float>(8 + mantissa), exponent - 7 - 3);  // (1 + m/8) 2^(e-7)
      }
      t[static_cast<size_t>(code)] = sign ? -v : v;
    }
    return t;
  }();
  return table;
}

}  // namespace

float fp8_e4m3fn_to_float(uint8_t code) { return e4m3fn_values()[code]; }

int64_t fp8_scale_rows(int64_t rows, Fp8Block block) {
  return (rows + block.rows - 1) / block.rows;
}

int64_t fp8_scale_cols(int64_t cols, Fp8Block block) {
  return (cols + block.cols - 1) / block.cols;
}

void fp8_block_dequantize(std::string_view name, std::span<const uint8_t> codes, int64_t rows,
                          int64_t cols, std::span<const float> scale_inv, Fp8Block block,
                          std::span<float> out) {
  MOEPEAK_CHECK_INPUT(block.rows > 0 && block.cols > 0, "tensor \"", name,
                      "\": weight_block_size [", block.rows, ", ", block.cols,
                      "] must be positive");
  MOEPEAK_CHECK_INPUT(rows >= 0 && cols >= 0, "tensor \"", name, "\": shape (", rows, ", ", cols,
                      ") is negative");
  const int64_t scale_rows = fp8_scale_rows(rows, block), scale_cols = fp8_scale_cols(cols, block);
  MOEPEAK_CHECK_INPUT(static_cast<int64_t>(codes.size()) == rows * cols, "tensor \"", name,
                      "\": ", codes.size(), " FP8 codes for shape (", rows, ", ", cols, ")");
  MOEPEAK_CHECK_INPUT(static_cast<int64_t>(scale_inv.size()) == scale_rows * scale_cols,
                      "tensor \"", name, "_scale_inv\": ", scale_inv.size(), " scales, but (", rows,
                      ", ", cols, ") in blocks of [", block.rows, ", ", block.cols, "] needs (",
                      scale_rows, ", ", scale_cols, ")");
  MOEPEAK_CHECK(static_cast<int64_t>(out.size()) == rows * cols,
                "fp8_block_dequantize: ", out.size(), " outputs for ", rows * cols, " elements of ",
                name);
  for (int64_t bi = 0; bi < scale_rows; ++bi) {
    for (int64_t bj = 0; bj < scale_cols; ++bj) {
      const float s = scale_inv[static_cast<size_t>(bi * scale_cols + bj)];
      MOEPEAK_CHECK_INPUT(std::isfinite(s) && s > 0, "tensor \"", name, "_scale_inv\": block (", bi,
                          ", ", bj, ") has scale ", s, "; scales must be finite and positive");
    }
  }
  const std::array<float, 256>& values = e4m3fn_values();
  for (int64_t i = 0; i < rows; ++i) {
    const float* scale_row = scale_inv.data() + (i / block.rows) * scale_cols;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = static_cast<size_t>(i * cols + j);
      const float v = values[codes[at]];
      if (std::isnan(v)) {
        MOEPEAK_INPUT_ERROR("tensor \"", name, "\": element (", i, ", ", j, ") is ",
                            codes[at] == 0x7F ? "0x7F" : "0xFF", ", float8_e4m3fn's NaN");
      }
      out[at] = v * scale_row[j / block.cols];
    }
  }
}

}  // namespace moepeak
