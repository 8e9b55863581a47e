// CRC32C with a table built at compile time (crc32c.h).
#include "core/metrics/crc32c.h"

#include <array>

namespace moepeak {

namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

// table[b]: the CRC register after shifting the byte b through it eight times.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) ? (r >> 1) ^ kCastagnoliReflected : r >> 1;
    table[b] = r;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t r = ~crc;  // the register starts all ones; the CRC is its complement
  for (size_t i = 0; i < bytes; ++i) r = kCrc32cTable[(r ^ p[i]) & 0xFFu] ^ (r >> 8);
  return ~r;
}

}  // namespace moepeak
