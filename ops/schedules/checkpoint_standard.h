// Standard per-layer gradient checkpointing (the reference SCO is held to): each layer's input
// stays on device from forward until its recompute in backward, in the `boundaries` live set.
// The model (core/model/mixtral.cpp) keeps them; this is their size.
//
//   boundaries = (L + 1) x N x H x b   layer inputs 0..L-1 and the final hidden state; while
//                                      layer l is recomputed its output replaces the freed
//                                      input of layer l+1, so the count never exceeds L + 1.
// With checkpoint = "none" the same L + 1 tensors are kept (next to every layer's activations).
#pragma once

#include <cstdint>

#include "core/runtime/arena.h"
#include "core/runtime/dtype.h"

namespace moepeak::schedules {

inline uint64_t boundaries_standard_bytes(int64_t layers, int64_t tokens, int64_t hidden, DType dtype) {
  return static_cast<uint64_t>(layers + 1) *
         DeviceArena::footprint(static_cast<uint64_t>(tokens * hidden) * dtype_size(dtype));
}

}  // namespace moepeak::schedules
