// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TensorBoard's record framing checks
// it (core/metrics/tensorboard_writer.h): a 256-entry table, one byte per step. Not meant for
// bulk data: the records it guards are a few hundred bytes a step.
//
//   crc32c("123456789", 9) == 0xE3069283
//   crc32c_extend(crc32c(a, n), b, m) == crc32c of a then b
//   masked_crc32c(data, n) == rotate_right(crc32c(data, n), 15) + 0xa282ead8
#pragma once

#include <cstddef>
#include <cstdint>

namespace moepeak {

// The CRC of `bytes` bytes at `data` continued from `crc`, the CRC of the bytes before them (0
// for none).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes);
inline uint32_t crc32c(const void* data, size_t bytes) { return crc32c_extend(0, data, bytes); }

// The masked form TFRecord stores (a CRC of data that holds CRCs stays distinct from them).
inline uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t masked_crc32c(const void* data, size_t bytes) {
  return mask_crc32c(crc32c(data, bytes));
}

}  // namespace moepeak
