// __nv_bfloat16 for the CPU emulation of CUDA: the bits of a bf16 (the top half of an IEEE
// float), CUDA's conversions (round to nearest even, NaN kept NaN) and the implicit float
// conversions nvcc allows in host and device code.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16_raw {
  unsigned short x;
};

inline unsigned short moepeak_emulated_float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<unsigned short>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
inline float moepeak_emulated_bf16_bits_to_float(unsigned short bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(moepeak_emulated_float_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(moepeak_emulated_float_to_bf16_bits(static_cast<float>(d))) {}
  operator float() const { return moepeak_emulated_bf16_bits_to_float(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
  return __nv_bfloat16(__nv_bfloat16_raw{bits});
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
