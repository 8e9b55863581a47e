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
  // How long OpenBLAS's idle workers spin before they sleep, when select_blas_kernels() set it
  // (or that a user's OPENBLAS_THREAD_TIMEOUT was kept); empty when this OpenBLAS cannot.
  std::string idle;
};

// OpenBLAS's worker threads, after each GEMM, spin in sched_yield for 2^28 TSC cycles (~0.1 s)
// before they sleep: between two GEMMs of a step they hold a core the rank's own threads need for
// the elementwise ops, the loss and the attention (a sixth of a small step's samples on 2 cores,
// docs/perf.md). select_blas_kernels() sets OPENBLAS_THREAD_TIMEOUT to this (2^N cycles) unless
// the user set it, and restarts OpenBLAS's threads so they read it.
constexpr int kBlasIdleSpinLog2 = 16;

// The kernels OpenBLAS would pick for a CPU with these features when its own detection fell back
// to a core without AVX2 ("" to keep the detected core): "SkylakeX" with AVX-512 F/BW/VL/DQ,
// "Haswell" with AVX2 and FMA. Pure, for the tests.
std::string preferred_blas_core(const std::string& detected, bool avx2_fma, bool avx512);

// Once per process (later calls return the first result): when OPENBLAS_CORETYPE is unset and
// preferred_blas_core() names a core for this CPU, re-run OpenBLAS's kernel selection with that
// core forced (OPENBLAS_CORETYPE is set for this process and its children); then shorten the
// workers' idle spin (kBlasIdleSpinLog2). Must run while no BLAS call is in flight. A user's
// OPENBLAS_CORETYPE and OPENBLAS_THREAD_TIMEOUT are always kept.
const BlasKernels& select_blas_kernels();

}  // namespace moepeak
