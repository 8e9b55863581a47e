// Which OpenBLAS kernels this process runs, and the correction of a wrong guess.
//
// Debian's OpenBLAS is built for every x86-64 core (DYNAMIC_ARCH) and picks its kernels at load
// time from the CPU's family and model numbers. A CPU it does not know (a new Xeon, a VM that
// hides the model: "Intel(R) Xeon(R) Processor") falls back to the SSE3 kernels of a Prescott,
// a third of the AVX-512 kernels' speed at our GEMM shapes (docs/perf.md "BLAS kernels"). The
// CPU backend calls select_blas_kernels() once per process, before its first GEMM.
#pragma once

#include <string>

namespace moepeak {

struct BlasKernels {
  std::string detected;  // OpenBLAS's own choice ("Prescott", "SkylakeX", ...)
  std::string active;    // what runs now
  // Why `active` differs from `detected`, or why it was left alone; empty when nothing applied.
  std::string note;
};

// The kernels OpenBLAS would pick for a CPU with these features when its own detection fell back
// to a core without AVX2 ("" to keep the detected core): "SkylakeX" with AVX-512 F/BW/VL/DQ,
// "Haswell" with AVX2 and FMA. Pure, for the tests.
std::string preferred_blas_core(const std::string& detected, bool avx2_fma, bool avx512);

// Once per process (later calls return the first result): when OPENBLAS_CORETYPE is unset and
// preferred_blas_core() names a core for this CPU, re-run OpenBLAS's kernel selection with that
// core forced (OPENBLAS_CORETYPE is set for this process and its children). Must run while no
// BLAS call is in flight. A user's OPENBLAS_CORETYPE is always kept.
const BlasKernels& select_blas_kernels();

}  // namespace moepeak
