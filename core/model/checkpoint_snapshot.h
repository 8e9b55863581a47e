// The pinned host bytes of an asynchronous checkpoint's snapshot (checkpoint.async,
// core/checkpoint/async_checkpoint.h): one function, used by the saver to allocate and by the
// planner (core/plan/plan.cpp) to print the host term "checkpoint_snapshot".
//
// The snapshot is a host copy of every flat buffer a checkpoint saves, as this rank holds it:
// the weights (P elements of the working dtype) and each optimizer state (m and v, and a master
// when the weights are bf16: P elements of the state dtype each), one pinned block per flat.
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/dtype.h"

namespace moepeak {

// The dtypes of the flats a checkpoint saves, in order, for AdamW over `working` weights:
// {working, state, state} plus a master {state} when working is bf16 (state = f32 then, the
// working dtype otherwise), as ops/schedules/adamw_host_state.h keeps them.
std::vector<DType> checkpoint_flat_dtypes(DType working);

// Pinned bytes of the snapshot of `elements` per flat (ZeroParamStore's flat_values().numel(),
// the planner's zero_persistent_elements) over flats of `dtypes`, pool rounding included.
uint64_t checkpoint_snapshot_bytes(int64_t elements, const std::vector<DType>& dtypes);

}  // namespace moepeak
