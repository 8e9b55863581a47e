// router_balance: DeepSeek-V3's auxiliary-loss-free load balancing (DeepSeek-V3 technical report,
// section 2.1.2), on the host. RouterScore::sigmoid_group_limited (ops/router.h) adds a
// correction bias to each expert's score for the choice only; the bias has no gradient. After
// each training step the trainer counts how many tokens each expert received over the whole job
// (every rank's top-k choices, all-reduced) and moves each bias one fixed step toward balance:
//
//   new_bias[e] = bias[e] + gamma * sign(mean_load - load[e]),   mean_load = sum(load) / E,
//   sign(0) = 0
//
// so an overloaded expert's bias falls by gamma, an underloaded one's rises by gamma, and an
// expert exactly at the mean keeps its bias. gamma is the report's bias update speed (0.001 for
// most of DeepSeek-V3's pre-training, 0 at the end).
//
//   load:  (E) int64, >= 0      tokens routed to each expert (each token counts once per expert
//                               that chose it)
//   bias:  (E) f32 | f64        updated in place (the correction_bias tensor's host copy)
//
// NOTES: the sign is decided in integers, sign(sum(load) - E * load[e]), so an expert exactly at
// a mean that double cannot hold (sums beyond 2^53) still keeps its bias; each new bias is
// double(bias[e]) + gamma * sign rounded once to the span's type. Throws moepeak::Error when the
// sizes differ, a load is negative, E * sum(load) overflows int64, or gamma is negative or not
// finite.
// Test: tests/ops/test_router_group_limited.cpp (RouterBalance).
#pragma once

#include <cstdint>
#include <span>

namespace moepeak::ops {

void update_correction_bias(std::span<const int64_t> load, double gamma, std::span<float> bias);
void update_correction_bias(std::span<const int64_t> load, double gamma, std::span<double> bias);

}  // namespace moepeak::ops
