// CpuAdamW: the host-side AdamW of the serial CPU offload (optimizer.placement =
// "offload_serial", as ZeRO-Offload runs DeepSpeed's CPU Adam): vectorised (AVX2 through
// adamw_span) and multi-threaded (a WorkerPool of host threads), over fp32 (or f64) master
// weights, m, v and gradients that all live in host memory.
//
//   CpuAdamW adam(threads);
//   adam.step(master, grad, m, v, segments, hyper);   // synchronous, on the calling thread + pool
//   adam.step(master, grad, m, v, segments, hyper, working);     // + bf16 working weights
//
//   master, grad, m, v: flat host arrays of the same length and type T = f32 | f64
//   working (optional, T = f32 only): a flat host bf16 array of that length, written with each
//             updated element of the master rounded to nearest even (as DeepSpeed's CPU Adam
//             writes the half-precision parameters it copies back), in the same tile as the
//             update (adamw_span_bf16_working), so the rounding costs no second pass over the
//             master
//   segments: the runs of the flat arrays to update, each with its weight-decay flag (a
//             parameter piece: decay off for RMSNorm weights); elements outside every segment
//             (alignment padding) are not touched
//
// Work is cut into tiles of at most kTileElements of one segment and handed to the threads one
// tile at a time; the update is element-wise, so the split changes no bit: the result is bitwise
// that of ops::adamw_cpu on each segment (adamw_simd.h says why the vector path agrees), and the
// bf16 working weights are those adamw_fused writes (ops/adamw_fused.h).
// Test: tests/ops/test_adamw_kernels.cpp (CpuAdamW.*).
#pragma once

#include <cstdint>
#include <span>

#include "core/runtime/dtype.h"
#include "ops/adamw.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/cpu/worker_pool.h"

namespace moepeak::ops {

class CpuAdamW {
 public:
  // A run of the flat arrays [offset, offset + length) with one decay flag.
  struct Segment {
    int64_t offset = 0, length = 0;
    bool decay = true;
  };
  // NOTES: 16384 f32 elements = 64 KiB per array, 256 KiB for the four a tile streams: enough to
  // amortise handing out a tile, small enough that the threads stay balanced on small models.
  static constexpr int64_t kTileElements = 16384;

  // threads <= 0: every core (std::thread::hardware_concurrency()).
  explicit CpuAdamW(int threads, AdamWSimd simd = AdamWSimd::automatic);

  int threads() const { return pool_.threads(); }

  template <typename T>
  void step(T* master, const T* grad, T* m, T* v, std::span<const Segment> segments,
            const AdamWHyper& hyper, bf16* working = nullptr);

 private:
  WorkerPool pool_;
  AdamWSimd simd_;
};

extern template void CpuAdamW::step<float>(float*, const float*, float*, float*,
                                           std::span<const Segment>, const AdamWHyper&, bf16*);
extern template void CpuAdamW::step<double>(double*, const double*, double*, double*,
                                            std::span<const Segment>, const AdamWHyper&, bf16*);

}  // namespace moepeak::ops
