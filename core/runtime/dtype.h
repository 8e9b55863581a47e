// Element types of tensors: f32 and f64 (CPU compute, float64 references in tests), bf16 (GPU
// storage), and integer types for token ids and routing indices.
//
// bf16 here is a host-side value type with round-to-nearest-even conversion, bit-compatible with
// CUDA's __nv_bfloat16, so a buffer written by a kernel reads back correctly on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moepeak {

enum class DType : int { f32, bf16, f64, i32, i64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, keep sign
    }
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(bf16) == 2);

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};

}  // namespace moepeak
