// The tensor-core path of CUDA attention (ops/cuda/attention_tc.cu): causal grouped-query flash
// attention forward and backward, with an optional sliding window, attention sinks and packed
// documents, for bf16 storage with query/key head dim dqk and value head dim dv each 32, 64, 128,
// 192 or 256, its two GEMMs per tile on bf16 tensor cores (WMMA 16x16x16, fp32 accumulation).
// ops/cuda/attention.cu calls it for the calls it takes (attention_tc_takes) and runs its SIMT
// kernels for the rest (f32, other head dims, pairs whose shared memory does not fit, unaligned
// views), and dsinks for both (ops/cuda/attention_sinks.cu). Same arguments and semantics as
// ops/attention.h.
// Test: ctest -L cuda -R test_backend_ops (the bf16 attention cases with head dims 32 to 256).
#pragma once

#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace moepeak::ops {

// True when the tensor-core kernels handle this call: bf16 storage; dqk = q.size(3) and
// dv = v.size(3) each in {32, 64, 128, 192, 256} with every kernel's shared memory within sm_90's
// 227 KiB per block (dqk + dv <= 320 of these: (192, 128) runs here, (256, 256) on the SIMT
// kernels); and every bf16 tensor's data 16-byte aligned (the kernels move 8 elements per load).
bool attention_tc_takes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor* dout = nullptr, const Tensor* dq = nullptr,
                        const Tensor* dk = nullptr, const Tensor* dv = nullptr);

// The arguments, the head dims and the launch grid are checked by the caller
// (attention_forward_cuda / attention_backward_cuda). `window` is the variant's window as the
// kernels take it: 0 (plain causal, also for a window >= T) or 0 < W < T. `sinks` is (nh) bf16
// or undefined; `doc_start` (B, T) i32 device memory or undefined (ops/attention.h). The backward
// writes dq, dk, dv only (the caller runs dsinks).
void attention_forward_tc(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                          int64_t window, const Tensor& sinks, const Tensor& doc_start,
                          const Tensor& out, const Tensor& lse, Stream& stream);
void attention_backward_tc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, double scale, int64_t window,
                           const Tensor& doc_start, const Tensor& dq, const Tensor& dk,
                           const Tensor& dv, Stream& stream);

}  // namespace moepeak::ops
