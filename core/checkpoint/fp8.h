// FP8 block-scaled weights, as DeepSeek-V3, R1 and Kimi-K2 are released: decode exactly.
//
// A projection W (rows, cols) is stored as two safetensors tensors:
//
//   <name>                  F8_E4M3 (rows, cols)      float8_e4m3fn codes, one byte each
//   <name>_scale_inv        F32 (ceil(rows/br), ceil(cols/bc))
//                                                     one scale per block of config.json's
//                                                     quantization_config.weight_block_size
//                                                     [br, bc] (128 x 128 in the releases)
//
//   W[i, j] = fp32(e4m3fn(code[i, j])) * scale_inv[i / br, j / bc]    (an fp32 product)
//
// The edge blocks may be partial (rows or cols not a multiple of the block): they use the scale
// of the block they start, as DeepSeek's weight_dequant and transformers' finegrained FP8 do.
//
// float8_e4m3fn (OCP FP8 E4M3, "fn": finite, no infinities): sign, 4 exponent bits (bias 7),
// 3 mantissa bits; exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are NaN; the largest
// finite value is 448. Every code is exact in fp32 and bf16 (at most 4 significant bits).
// The product with an fp32 scale is rounded once to fp32, the dtype DeepSeek's reference and
// transformers dequantise into; the importer then converts to the working dtype.
//
//   std::vector<float> w(rows * cols);
//   fp8_block_dequantize("model.layers.3.mlp.experts.0.gate_proj.weight", codes, rows, cols,
//                        scale_inv, {128, 128}, w);
//
// Test: tests/data/test_fp8.cpp (ctest -R test_fp8).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace moepeak {

// The block of weight_block_size: rows x cols elements share a scale.
struct Fp8Block {
  int64_t rows = 128;
  int64_t cols = 128;
};

// The value of one float8_e4m3fn code, exactly (NaN for 0x7F and 0xFF).
float fp8_e4m3fn_to_float(uint8_t code);

// Scales a (rows, cols) weight with blocks of `block` needs: ceil(rows/br) x ceil(cols/bc).
int64_t fp8_scale_rows(int64_t rows, Fp8Block block);
int64_t fp8_scale_cols(int64_t cols, Fp8Block block);

// Decodes codes (rows, cols) row-major with scale_inv (fp8_scale_rows, fp8_scale_cols) into out
// (rows, cols), every element written. Throws moepeak::Error naming the tensor (`name`) for
// spans whose sizes differ from the shapes', a block of 0 or fewer rows or columns, a NaN code
// (naming the element) and a scale that is not finite or not positive (naming the block).
void fp8_block_dequantize(std::string_view name, std::span<const uint8_t> codes, int64_t rows,
                          int64_t cols, std::span<const float> scale_inv, Fp8Block block,
                          std::span<float> out);

}  // namespace moepeak
