// linear: y = x W^T without bias (every projection of the decoder: q/k/v/o, the router
// gate, the experts' w1/w2/w3 and the LM head).
//
//   x:  (M, K) f32 | bf16 | f64 (on both backends)
//   w:  (N, K) same dtype (PyTorch's nn.Linear layout: out_features x in_features)
//   y:  (M, N)          y = x w^T, written (=) or, with accumulate, added (+=); x's dtype, or
//                       f32 when x is bf16 (an fp32 accumulator over several calls, as
//                       PipelinedLLEP sums a tile's output over F blocks), on both backends
//   dy: (M, N)
//   dx: (M, K)          dx = dy w, written (=) or, with accumulate_dx, added (+=);
//                       pass an undefined Tensor() to skip it (e.g. the first layer's input);
//                       x's dtype, or f32 when x is bf16 (an fp32 accumulator, as y)
//   dw: (N, K)          dw += dy^T x, always accumulated (+=); pass an undefined Tensor() to
//                       skip it (a product by a weight that needs no gradient here). x's dtype,
//                       or f32 when x is bf16 (the fp32 main gradient: the sum is accumulated
//                       into dw in fp32 with no bf16 rounding), on both backends
//
// The _cols variants multiply by a block of w's input columns, w[:, k0 : k0 + K] with K = x's
// columns, where w and dw are (N, K_w) with k0 + K <= K_w, and dw is updated in those columns
// only: an expert MLP blocked over F multiplies by w2's column block W2[:, f0 : f1] this way
// (ops/schedules/dispatch_pipelined_llep.cpp). k0 = 0 with K_w = K is the plain op.
//
// M == 0 is allowed (an expert that received no tokens): y/dx have no rows and dw is unchanged.
// K == 0 writes y = 0 (or leaves it with accumulate).
// CPU: GEMMs are OpenBLAS CBLAS (row-major sgemm/dgemm); with a fixed thread count OpenBLAS
// reduces each output element in a fixed order, so results are reproducible run to run. bf16
// storage runs ops/cpu/gemm_tiles.h: fixed-size tiles widened to fp32, sgemm, fp32 accumulation
// and one rounding to bf16 per output element per call (an accumulated output is read from bf16
// and added in fp32 before that rounding), as on CUDA; 6 MiB of thread-local scratch per stream
// thread, allocated at its first bf16 GEMM; reproducible run to run as well.
// CUDA (ops/cuda/linear.cpp): the same GEMMs through cuBLASLt (ops/cuda/cublaslt.h), enqueued on
// the stream: f32 in strict fp32 (no TF32), bf16 storage with fp32 accumulation (an accumulated
// output is read in bf16 and rounded to bf16 once per call), f64 in f64; an f32 y, dx or dw of a
// bf16 x is a GEMM with bf16 A/B and f32 C/D (fp32 accumulation, beta = 1 reads and writes it in
// fp32, no TF32). dx and dw are two GEMMs in stream order. Each stream's first GEMM allocates its
// 32 MiB cuBLASLt workspace (outside the arena), and each new shape, pointer alignment or dw
// dtype queries cuBLASLt's heuristic once; after that a call allocates nothing and does not
// synchronise. Results are reproducible run to run on one GPU model and cuBLAS version.
//
// Test: ctest -R test_dense_ops (CPU f32, f64); ctest -R test_gemm_bf16 (CPU bf16, f32 dw);
// ctest -R test_backend_ops (both backends, f32 dw included, cases in
// tests/ops/backend_ops/cases_linear.cpp).
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

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
// `cols` selects the _cols variants' w (N, K_w) with columns [k0, k0 + K); otherwise w is (N, K).
// Every tensor has x's dtype, except that a bf16 x may have an f32 y, dx or dw (fp32
// accumulators: the main gradient, PipelinedLLEP's tile sums).
void check_linear_forward_args(const char* op, const Tensor& x, const Tensor& w, int64_t k0,
                               bool cols, const Tensor& y);
// Which gradients a backward call forms: dx (dw) is wanted when it is defined or has a shape (a
// (0, K) dx has no bytes but is still given, and then checked like any other).
struct LinearGrads {
  bool dx = false;
  bool dw = false;
};
LinearGrads check_linear_backward_args(const char* op, const Tensor& x, const Tensor& w, int64_t k0,
                                       bool cols, const Tensor& dy, const Tensor& dx,
                                       const Tensor& dw);

// Benches (`bench gemm`): from now on the CUDA GEMMs of every op take the rank-th algorithm of
// cuBLASLt's heuristic list for their configuration (0, the default, is its first choice: what
// training runs; a rank past the list's end takes its last). Returns the previous rank. The CPU
// (OpenBLAS: one algorithm) and the grouped GEMMs (cuBLAS: no choice) ignore it.
constexpr int kGemmAlgorithmRanks = 8;       // ranks 0 .. 7
int set_gemm_algorithm_rank(int rank);       // ops/cpu/linear.cpp
int set_gemm_algorithm_rank_cuda(int rank);  // ops/cuda/linear.cpp (cuBLASLt's plan cache)

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void linear_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& y, bool accumulate,
                         Stream& stream);
void linear_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                          bool accumulate_dx, const Tensor& dw, Stream& stream);
void linear_forward_cols_cuda(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& y,
                              bool accumulate, Stream& stream);
void linear_backward_cols_cuda(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& dy,
                               const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                               Stream& stream);
inline void linear_forward(const Tensor& x, const Tensor& w, const Tensor& y, bool accumulate,
                           Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(linear_forward, y, x, w, y, accumulate, stream);
}
inline void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                            bool accumulate_dx, const Tensor& dw, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(linear_backward, dy, x, w, dy, dx, accumulate_dx, dw, stream);
}
inline void linear_forward_cols(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& y,
                                bool accumulate, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(linear_forward_cols, y, x, w, k0, y, accumulate, stream);
}
inline void linear_backward_cols(const Tensor& x, const Tensor& w, int64_t k0, const Tensor& dy,
                                 const Tensor& dx, bool accumulate_dx, const Tensor& dw,
                                 Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(linear_backward_cols, dy, x, w, k0, dy, dx, accumulate_dx, dw, stream);
}

}  // namespace moepeak::ops
