// FLOP counts of a training step and the machine's GEMM ceiling they are measured against.
//
// Model FLOPs per step (forward + backward, 2 FLOPs per multiply-add, recomputation not counted,
// as MFU is conventionally defined):
//   matmuls:   6 * N * P_active        P_active = per layer (q, k, v, o or the latent
//                                       attention's q_a, q_b or q, kv_a, kv_b, o; the router and
//                                       the top-k experts' w1, w2, w3 and the shared experts', or
//                                       the dense MLP) + the LM head; the embedding is a lookup
//                                       (ParamLayout::active_matmul_parameters)
//   attention: 3 * B * nh * (d + dv) * sum over layers of T^2 * f_l   (QK^T and PV, causal half:
//                                       forward 2 (d + dv) per (query, key) pair, T^2/2 pairs per
//                                       head per sequence, backward twice that: dQ, dK, dP, dV;
//                                       `bench attention` also counts the backward's recomputed
//                                       QK^T, 2 d more per pair), d the q/k heads' width and dv the
//                                       value heads' (DecoderSpec: = d but for latent attention,
//                                       DeepSeek-V3's d = 192, dv = 128), so 6 * B * nh * d * ...
//                                       when d = dv; f_l = 1 for a full layer and, for a sliding
//                                       window W, the share of causal (query, key) pairs it scores:
//                                       sum_t min(t + 1, W) / (T (T + 1) / 2)
// docs/perf.md repeats this formula.
#pragma once

#include <cstdint>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/dtype.h"

namespace moepeak {

double step_flops(const ModelConfig& model, int64_t batch, int64_t seq_len);

// Achieved GFLOP/s of one square GEMM of size n (OpenBLAS on the CPU), the best of `repeats`
// timed runs after one warm-up: the ceiling the step's throughput is compared with.
double measure_cpu_gemm_gflops(DType dtype, int n, int repeats);

// The same through the backend's own GEMM (ops::linear_forward, y = x w^T, n x n x n) on its
// default stream, timed with events: cuBLASLt on CUDA (f32 or bf16), OpenBLAS on the CPU. One
// untimed run first (algorithm choice, workspace), then the best of `repeats`. The three n x n
// tensors come from the arena (LiveSet::workspace) and are freed on return.
double measure_backend_gemm_gflops(Backend& backend, DType dtype, int n, int repeats);

}  // namespace moepeak
