// cuBLAS as the CPU emulation of CUDA provides it: the handle calls and the grouped GEMM moepeak
// makes (ops/cuda/grouped_linear.cpp), with cuBLAS's names, values and signatures. A subset,
// declared in cublas_api.h as in the real toolkit; see ../cublas.cpp for the semantics and what
// the emulation does not do.
#pragma once

#include "cublas_api.h"
