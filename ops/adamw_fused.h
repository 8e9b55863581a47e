// adamw_fused: the device stage of OffloadStreamAdamW — one AdamW update of a bucket's master
// weights, m and v (staged from pinned host memory into a device slot) with the gradient that
// backward left on the device, and the refresh of the working weights from the new master, in
// one pass over the elements.
//
//   master, m, v (n)  state dtype, updated in place (the staging slot)
//   grad (n)          the working dtype (on the device, where backward left it)
//   working (n)       the working dtype, written (= the new master)
//   The arithmetic is ops/adamw.h's, element for element and bit for bit (ops/cpu/adamw_simd.h).
//
// The CPU kernel runs f32 or f64 with working dtype = state dtype (the CPU backend trains in
// f32; the working weights are then a separate fp32 copy of the master). bf16 working weights
// with an fp32 master need the CUDA kernel, which is not in this version: adamw_fused_cpu throws
// naming the dtypes. Test: tests/ops/test_adamw_kernels.cpp (AdamWFused.*).
#pragma once

#include "core/runtime/stream.h"
#include "ops/adamw.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void adamw_fused_cpu(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream);

}  // namespace moepeak::ops
