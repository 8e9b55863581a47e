// CUDA's vector types (the ones moepeak's kernels use, with CUDA's alignment) for the CPU
// emulation of CUDA.
#pragma once

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};

inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
