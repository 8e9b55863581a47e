// This rank's rates measured at a config's shapes, for the step-time model
// (core/plan/step_time.h; `moepeak plan --time` on the CPU backend, `moepeak probe`):
//
//   gemm           the attention's q and o projections and the LM head (M = N tokens of the rank):
//                  forward, and backward's dx and dw, through ops::linear_* — FLOPs / time
//   grouped_gemm   the experts' w1 over the rank's E/Ep experts, N k rows split evenly (balanced
//                  routing), forward and backward, through ops::grouped_linear_*
//   attention      the first layer's attention at (B/(W/Sp), T, nh/Sp heads) with its window,
//                  forward and backward, through ops::attention_*
//   memory         ops::add over max(N H, 2^22) elements (3 streams of b bytes each)
//   elementwise    the SwiGLU forward and backward over N k rows of F (at most 2^22 elements), in
//                  the model's bytes (step_time.h: kSwigluBytesPerElement, 3 forwards)
//   loss           the cross-entropy forward and backward over N rows of V logits (at most 2^22),
//                  kLossBytesPerLogit per logit
//   op latency     16 adds of one element in a row, per add: what an op costs beyond its work
//   host           a 64 MiB memcpy between host buffers (the CPU's host link and its AdamW's
//                  memory rate; on CUDA `moepeak probe` replaces the host link by its host-link
//                  bench's pinned copies of GPU 0, cli/probe_cmd.cpp)
//   peak           the backend's n^3 GEMM ceiling (n = 1024 on the CPU, 8192 on CUDA), for MFU
// Each the median of `repeats` timings after one warm-up, on the backend's default stream. The
// links between ranks are not measured here (machine_rates.h: set_cpu_links).
#pragma once

#include "core/config/config.h"
#include "core/plan/plan.h"
#include "core/plan/step_time.h"
#include "core/runtime/backend.h"

namespace moepeak::measure {

MachineRates measure_machine_rates(Backend& backend, const Config& cfg, const PlanInputs& inputs,
                                   int repeats = 3);

}  // namespace moepeak::measure
