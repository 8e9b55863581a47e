// The storage dtypes a schedule accepts on a backend: f32 and f64 everywhere, bf16 on CUDA (its
// kernels store bf16 and compute in fp32; the CPU ops compute in the storage type, f32 or f64).
// Each schedule checks its dtype at construction with this, so a bf16 request on the CPU fails
// there, naming the schedule, instead of in the first op.
#pragma once

#include "core/error.h"
#include "core/runtime/backend.h"

namespace moepeak::schedules {

inline void check_schedule_dtype(const Backend& backend, DType dtype, const char* schedule) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 ||
                    (dtype == DType::bf16 && backend.kind() == BackendKind::cuda),
                schedule, ": dtype ", dtype_name(dtype),
                " (f32 or f64 expected; bf16 on the CUDA backend)");
}

}  // namespace moepeak::schedules
