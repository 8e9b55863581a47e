// MXFP4, the packed expert weights of gpt-oss checkpoints: decode exactly, encode with the OCP
// Microscaling (MX) v1.0 rounding.
//
// A tensor W of logical shape [..., cols] (cols % 32 == 0; gpt-oss: [E, rows, cols]) is stored as
// two U8 safetensors tensors:
//
//   <name>_blocks  [..., cols/32, 16]  32 E2M1 (FP4) codes per block, two per byte: element 2j
//                                      of a block is byte j's low nibble, element 2j+1 its high
//   <name>_scales  [..., cols/32]      one E8M0 exponent per block, bias 127 (255 is NaN)
//
//   value = kMxfp4Values[code] * 2^(scale - 127)
//   kMxfp4Values = {+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6}
//
// Leading dims may be any number >= 0 (blocks have >= 2 dims, scales one fewer); only the last
// two of blocks and the last of scales are special. transformers' convert_moe_packed_tensors then
// transposes the last two dims of the decoded [E, rows, cols] (gate_up_proj: rows = 2I, cols = H,
// giving [E, H, 2I]; down_proj: [E, H, I] -> [E, I, H]); that transpose is the importer's, not
// the codec's.
//
// Precision: a code has at most two significant bits, so every decoded value with scale <= 252
// is exact in f32 and in bf16 (both have 8 exponent bits; scale 0 gives down to 0.5 * 2^-127 =
// 2^-128, a subnormal of both). Scales 253 and 254 overflow f32 for the larger codes (4 * 2^126
// = 2^128): decoding such an element is an error, as is scale 255, rather than an inf or NaN.
//
//   Shape logical = mxfp4_decoded_shape("w", blocks_shape, scales_shape);   // validates the pair
//   std::vector<float> w(logical.numel());
//   mxfp4_dequantize("w", blocks, blocks_shape, scales, scales_shape, w);
//   mxfp4_quantize("w", w, logical, blocks, scales);                         // the inverse
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/runtime/tensor.h"

namespace moepeak {

constexpr int64_t kMxfp4BlockSize = 32;      // elements sharing one scale
constexpr int64_t kMxfp4BytesPerBlock = 16;  // two E2M1 codes per byte
constexpr int kMxfp4ScaleBias = 127;         // E8M0: 2^(scale - 127); 255 is NaN
constexpr float kMxfp4Values[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The logical shape of the decoded tensor: scales_shape with its last dim times 32. Throws an
// input moepeak::Error naming the tensor (`name`, the weight without _blocks/_scales) unless
// blocks has >= 2 dims, scales exactly one fewer, the leading dims agree and blocks' last is 16.
Shape mxfp4_decoded_shape(std::string_view name, const Shape& blocks_shape,
                          const Shape& scales_shape);

// Decodes blocks [..., G, 16] and scales [..., G] into out [..., G * 32] (row-major), every value
// exactly (written in full). Throws moepeak::Error naming the tensor for a shape pair that
// mxfp4_decoded_shape refuses, for spans whose sizes differ from the shapes' (blocks and scales
// one byte per element, out mxfp4_decoded_shape(...).numel() floats), for a scale of 255 (NaN in
// E8M0) and for an element that overflows f32 (scale 253 or 254 with a large code); the last two
// name the block or element by its index.
void mxfp4_dequantize(std::string_view name, std::span<const uint8_t> blocks,
                      const Shape& blocks_shape, std::span<const uint8_t> scales,
                      const Shape& scales_shape, std::span<float> out);

// Encodes values of `shape` [..., cols] (cols % 32 == 0) into blocks (numel / 2 bytes, the layout
// [..., cols/32, 16]) and scales (numel / 32 bytes, [..., cols/32]), both written in full, with
// the OCP MX v1.0 rounding: per block of 32, the shared exponent
//     X = floor(log2(max |v|)) - 2        (2 = emax of E2M1, whose largest value is 6 = 1.5 * 2^2)
// clamped to E8M0's least, -127 (scale byte 0); each v / 2^X goes to the nearest E2M1 value, ties
// to the even code, saturating at +-6 (v / 2^X < 8 always, so only (6, 8) saturates).
// NOTES: the choices where the format leaves room, and why:
//   - A block of zeros (and any block whose max is below 2^-125, where X would be below -127)
//     gets scale byte 0: it is what the clamp of X = floor(log2 0) = -inf gives, and what
//     triton_kernels' downcast_to_mxfp (transformers' quantize_to_mxfp4) writes for zeros; its
//     codes decode to exact zeros at any scale.
//   - That triton code rounds the scale up instead (X = ceil(log2(max / 6)), never saturating):
//     where OCP's max / 2^X lies in (6, 8) its X is one larger and its bytes differ from these.
//   - The sign is kept: -0 (and a negative value that rounds to zero) is code 8, as triton writes
//     it, so decode(encode(v)) == v bit for bit for every v that decodes some MXFP4 bytes.
//   - Re-encoding decoded bytes gives the same values bit for bit, and the same bytes for each
//     block whose scale is 0 or whose largest code is +-4 or +-6. Any other block re-encodes with
//     a smaller scale and larger codes of the same values (3 * 2^s == 6 * 2^(s-1)), X being
//     fixed by the block's max; an all-zero block with scale > 0 re-encodes with scale 0.
// Throws moepeak::Error naming the tensor for a shape whose last dim is not a multiple of 32,
// for span sizes other than those above, and for a NaN or infinite value (naming its index).
void mxfp4_quantize(std::string_view name, std::span<const float> values, const Shape& shape,
                    std::span<uint8_t> blocks, std::span<uint8_t> scales);

}  // namespace moepeak
