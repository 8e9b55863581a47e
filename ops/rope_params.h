// rope_params: what the RoPE op (ops/rope.h) needs to know of its frequencies, as plain scalars
// the host derives once per call site (ops/rope_scaling.h: the Hugging Face scaling types), and
// rope_inv_freq, the one formula from those scalars to inv_freq_i that the CPU loop
// (ops/cpu/rope.cpp) and the CUDA kernel (ops/cuda/rope.cu) both call, so the two backends cannot
// drift apart. Header-only C++17 without toml++ or spdlog: nvcc compiles it into the kernels.
//
//   RopeParams          a POD: passed by value as a kernel argument (no device allocation, no
//                       table of d/2 frequencies to copy); the CPU loop reads the same struct
//   RopeParams::standard(theta, head_dim)
//                       plain RoPE over the whole head: inv_freq_i = theta^(-2i/head_dim),
//                       attention factor 1, rotate_half pairs (i, i + head_dim/2)
//   rope_inv_freq(p, i) inv_freq_i for i < p.rotary_dim / 2, in double, by p.type:
//     default_, dynamic  base^(-2i/dim)               (dynamic: `base` is already the NTK base)
//     linear             base^(-2i/dim) / factor
//     yarn               ramp r_i = clamp((i - ramp_low) / (ramp_high - ramp_low), 0, 1),
//                        e_i = 1 - r_i (transformers' inv_freq_extrapolation_factor):
//                        (inv / factor) * (1 - e_i) + inv * e_i
//     llama3             wavelen = 2 pi / inv; wavelen > low_freq_wavelen: inv / factor;
//                        wavelen < high_freq_wavelen: inv; between, with
//                        s = (original_max_position / wavelen - low_freq_factor) /
//                            (high_freq_factor - low_freq_factor):
//                        (1 - s) * inv / factor + s * inv
//   with dim = p.rotary_dim and inv = base^(-2i/dim).
//
// NOTES: the default frequency is pow(base, -2i/dim) in double, one pow, exactly the expression
// the op has always used (transformers computes 1 / base^(2i/dim) in fp32; double keeps long
// positions accurate, ops/rope.h). Every scaled type starts from that same value, so a scaling
// with no effect (linear factor 1) is bitwise the default. On the GPU `pow` is CUDA's double pow,
// which may differ from glibc's in the last bit; the backends are compared with a tolerance
// (tests/ops/backend_ops/cases_rope.cpp).
#pragma once

#include <math.h>
#include <stdint.h>

#include <type_traits>

// Host and device in a .cu file (nvcc, or g++ in the CPU emulation of CUDA, whose prelude
// defines __host__ and __device__ away and __CUDACC_EMULATED__); plain inline elsewhere.
#if defined(__CUDACC__) || defined(__CUDACC_EMULATED__)
#define MOEPEAK_ROPE_HOST_DEVICE __host__ __device__
#else
#define MOEPEAK_ROPE_HOST_DEVICE
#endif

namespace moepeak::ops {

// The RoPE types of transformers' ROPE_INIT_FUNCTIONS that moepeak implements (longrope is not
// one of them). Names as transformers spells them: rope_type_name (ops/rope_scaling.h).
enum class RopeType : int32_t { default_, linear, dynamic, yarn, llama3 };

struct RopeParams {
  RopeType type;
  // Pairs (2i, 2i+1) instead of rotate_half's (i, i + rotary_dim/2).
  bool interleaved;
  // Elements [0, rotary_dim) of each head rotate (rotary_dim even, <= head_dim); the rest pass
  // through. The frequencies use dim = rotary_dim.
  int64_t rotary_dim;
  // theta; for dynamic the NTK-scaled base of the batch's sequence length.
  double base;
  // linear, yarn, llama3: the divisor of the interpolated frequencies; 1 otherwise.
  double factor;
  // yarn: the ramp's bounds in frequency index, after truncation, clamping and the +0.001 that
  // keeps them apart.
  double ramp_low, ramp_high;
  // llama3: original_max_position_embeddings, the two factors and the wavelength bounds
  // original / low_freq_factor (above: interpolate) and original / high_freq_factor (below: keep).
  double original_max_position;
  double low_freq_factor, high_freq_factor;
  double low_freq_wavelen, high_freq_wavelen;
  // Multiplies cos and sin (transformers' attention_scaling): the forward is x -> f R x.
  double attention_factor;

  // Plain RoPE over a whole head of `head_dim` elements.
  static RopeParams standard(double theta, int64_t head_dim) {
    RopeParams p;
    p.type = RopeType::default_;
    p.interleaved = false;
    p.rotary_dim = head_dim;
    p.base = theta;
    p.factor = 1.0;
    p.ramp_low = 0.0;
    p.ramp_high = 1.0;
    p.original_max_position = 0.0;
    p.low_freq_factor = 0.0;
    p.high_freq_factor = 0.0;
    p.low_freq_wavelen = 0.0;
    p.high_freq_wavelen = 0.0;
    p.attention_factor = 1.0;
    return p;
  }
};
static_assert(std::is_trivial_v<RopeParams> && std::is_standard_layout_v<RopeParams>,
              "RopeParams is a kernel argument: plain data only");

MOEPEAK_ROPE_HOST_DEVICE inline double rope_inv_freq(const RopeParams& p, int64_t i) {
  const double inv = pow(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.rotary_dim));
  switch (p.type) {
    case RopeType::linear:
      return inv / p.factor;
    case RopeType::yarn: {
      double ramp = (static_cast<double>(i) - p.ramp_low) / (p.ramp_high - p.ramp_low);
      ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
      const double extrapolation = 1.0 - ramp;
      return inv / p.factor * (1.0 - extrapolation) + inv * extrapolation;
    }
    case RopeType::llama3: {
      constexpr double kPi = 3.14159265358979323846;
      const double wavelen = 2.0 * kPi / inv;
      if (wavelen > p.low_freq_wavelen) return inv / p.factor;
      if (wavelen < p.high_freq_wavelen) return inv;
      const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                            (p.high_freq_factor - p.low_freq_factor);
      return (1.0 - smooth) * inv / p.factor + smooth * inv;
    }
    case RopeType::default_:
    case RopeType::dynamic:
      break;
  }
  return inv;
}

}  // namespace moepeak::ops
