// CpuAdamW: tiles of the segments over a WorkerPool, each tile through adamw_span (see
// cpu_adamw.h). Test: ctest -R test_adamw_kernels
#include "ops/cpu/cpu_adamw.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace moepeak::ops {

CpuAdamW::CpuAdamW(int threads, AdamWSimd simd) : pool_(threads), simd_(simd) {}

template <typename T>
void CpuAdamW::step(T* master, const T* grad, T* m, T* v, std::span<const Segment> segments,
                    const AdamWHyper& hyper, bf16* working) {
  MOEPEAK_CHECK(hyper.step >= 1, "adamw: step ", hyper.step, " (steps count from 1)");
  MOEPEAK_CHECK(working == nullptr || (std::is_same_v<T, float>),
                "CpuAdamW: bf16 working weights need an f32 master, not f64");
  struct Tile {
    int64_t offset, length;
    bool decay;
  };
  std::vector<Tile> tiles;
  for (const Segment& s : segments) {
    MOEPEAK_CHECK(s.offset >= 0 && s.length >= 0, "CpuAdamW: bad segment [", s.offset, ", +",
                  s.length, ")");
    for (int64_t at = 0; at < s.length; at += kTileElements) {
      tiles.push_back({s.offset + at, std::min(kTileElements, s.length - at), s.decay});
    }
  }
  const AdamWScalars<T> with_decay = AdamWScalars<T>::make(hyper, true);
  const AdamWScalars<T> without_decay = AdamWScalars<T>::make(hyper, false);
  const AdamWSimd simd = simd_;
  pool_.run(static_cast<int64_t>(tiles.size()), [&](int64_t i) {
    const Tile& t = tiles[static_cast<size_t>(i)];
    const AdamWScalars<T>& s = t.decay ? with_decay : without_decay;
    if constexpr (std::is_same_v<T, float>) {
      if (working != nullptr) {
        adamw_span_bf16_working(master + t.offset, grad + t.offset, m + t.offset, v + t.offset,
                                working + t.offset, t.length, s, simd);
        return;
      }
    }
    adamw_span<T>(master + t.offset, grad + t.offset, m + t.offset, v + t.offset, nullptr, t.length,
                  s, simd);
  });
}

template void CpuAdamW::step<float>(float*, const float*, float*, float*, std::span<const Segment>,
                                    const AdamWHyper&, bf16*);
template void CpuAdamW::step<double>(double*, const double*, double*, double*,
                                     std::span<const Segment>, const AdamWHyper&, bf16*);

}  // namespace moepeak::ops
