// linear: y = x W^T without bias (every projection of the Mixtral decoder: q/k/v/o, the router
// gate, the experts' w1/w2/w3 and the LM head).
//
//   x:  (M, K) f32 | f64
//   w:  (N, K) same dtype (PyTorch's nn.Linear layout: out_features x in_features)
//   y:  (M, N)          y = x w^T, written (=) or, with accumulate, added (+=)
//   dy: (M, N)
//   dx: (M, K)          dx = dy w, written (=) or, with accumulate_dx, added (+=);
//                       pass an undefined Tensor() to skip it (e.g. the first layer's input)
//   dw: (N, K)          dw += dy^T x, always accumulated (+=)
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

}  // namespace moepeak::ops
