// linear: y = x W^T without bias (every projection of the Mixtral decoder: q/k/v/o, the router
// gate, the experts' w1/w2/w3 and the LM head).
//
//   x:  (M, K) f32 | f64
//   w:  (N, K) same dtype (PyTorch's nn.Linear layout: out_features x in_features)
//   y:  (M, N)          y = x w^T, written (=) or, with accumulate, added (+=)
//   dy: (M, N)
//   dx: (M, K)          dx = dy w, written (=) or, with accumulate_dx, added (+=);
//                       pass an undefined Tensor() to skip it (e.g. the first layer's input)
//   dw: (N, K)          dw += dy^T x, always accumulated (+=); pass an undefined Tensor() to
//                       skip it (a product by a weight that needs no gradient here)
//
// The _cols variants multiply by a block of w's input columns, w[:, k0 : k0 + K] with K = x's
// columns, where w and dw are (N, K_w) with k0 + K <= K_w, and dw is updated in those columns
// only: an expert MLP blocked over F multiplies by w2's column block W2[:, f0 : f1] this way
// (ops/schedules/dispatch_pipelined_llep.cpp). k0 = 0 with K_w = K is the plain op.
//
// M == 0 is allowed (an expert that received no tokens): y/dx have no rows and dw is unchanged.
// GEMMs are OpenBLAS CBLAS (row-major sgemm/dgemm); with a fixed thread count OpenBLAS reduces
// each output element in a fixed order, so results are reproducible run to run.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void linear_forward_cpu(const Tensor& x, const Tensor& w, const Tensor& y, bool accumulate,
                        Stream& stream);
void linear_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                         bool accumulate_dx, const Tensor& dw, Stream& stream);
void linear_forward_cols_cpu(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& y,
                             bool accumulate, Stream& stream);
void linear_backward_cols_cpu(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& dy,
                              const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                              Stream& stream);

}  // namespace moepeak::ops
