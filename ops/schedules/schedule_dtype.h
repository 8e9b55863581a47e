// The storage dtypes a schedule accepts: f32, bf16 (fp32 arithmetic; on the CPU too,
// ops/cpu/cpu_storage.h) and f64. Each schedule checks its dtype at construction with this, so an
// integer dtype fails there, naming the schedule, instead of in the first op.
#pragma once

#include "core/error.h"
#include "core/runtime/backend.h"

namespace moepeak::schedules {

inline void check_schedule_dtype(const Backend& /*backend*/, DType dtype, const char* schedule) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16, schedule,
                ": dtype ", dtype_name(dtype), " (f32, bf16 or f64 expected)");
}

// The dtype gradients are summed in for weights stored in `dtype`: fp32 for bf16 (Megatron's and
// FSDP2's "main grads": a sum over chunks, rounds, micro-batches and ranks rounds once per add in
// fp32, not in bf16), the storage dtype otherwise. Every gradient buffer that outlives one op (the
// ZeRO-3 shards and gathered slots, LLEP's spilled-expert grads, Ring-DTP's rotating dW and dX
// partials) and every gradient collective uses it; the planner counts `grads` with it.
inline DType main_grad_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

}  // namespace moepeak::schedules
