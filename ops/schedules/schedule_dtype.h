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

}  // namespace moepeak::schedules
