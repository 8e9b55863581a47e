// dsinks of CUDA attention (ops/cuda/attention_sinks.cu), for both the SIMT (ops/cuda/attention.cu)
// and the tensor-core (attention_tc.cu) paths: the sinks' gradient reads only out, dout and lse, so
// one kernel serves both. Semantics as ops/attention.h.
//
//   q: (B, T, nh, dqk)   out, dout: (B, T, nh, dv)   lse: (B, nh, T) compute dtype
//   sinks: (nh) q's dtype   dsinks: (nh) f32 for bf16 q, else q's dtype; accumulated (+=)
#pragma once

#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace moepeak::ops {

// dsinks[h] += -sum_{b,t} exp(sinks[h] - lse[b,h,t]) (dout . out)[b,t,h], one block per query
// head, in double and a fixed order (bitwise reproducible, no atomics). The arguments are checked
// by the caller (attention_backward_cuda); `op` names the call in errors.
void attention_dsinks_cuda(const Tensor& q, const Tensor& out, const Tensor& lse,
                           const Tensor& dout, const Tensor& sinks, const Tensor& dsinks,
                           Stream& stream, const char* op);

}  // namespace moepeak::ops
