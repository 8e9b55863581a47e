// cuda_runtime.h of the CPU emulation of CUDA: the runtime API, and in a rewritten .cu file (and
// any file that includes this one) what nvcc gives device code (device_prelude.h).
#pragma once

#include "cuda_runtime_api.h"
#include "tests/cuda_emulation/device_prelude.h"
