// SerialOffloadAdamW (optimizer.placement = "offload_serial"): the CPU-offload baseline as
// ZeRO-Offload runs it — master weights, m and v in pinned host memory (HostAdamWState), and per
// step, one stage after the other:
//   1. gradients device -> host (each piece into a pinned host gradient buffer), wait;
//   2. the host AdamW (ops/cpu/cpu_adamw.h: AVX2, a pool of host threads, like DeepSpeed's
//      CPU Adam) over master, m, v;
//   3. the new master host -> device into the working weights.
// The device is idle during 2; nothing overlaps — the schedule OffloadStreamAdamW improves on.
//
// Device bytes (live set `optimizer`): 0. Pinned host bytes: adamw_offload_host_bytes(P, dtype)
// in `optimizer` + adamw_offload_serial_grad_bytes(P, dtype) in `grads`.
// Exactness: the host AdamW computes the element-wise kernel of ops/adamw.h bit for bit, so
// weights, m and v equal ResidentAdamW's after any number of steps.
// Test: tests/ops/test_adamw_offload.cpp, tests/parallel/test_adamw_offload_parallel.cpp,
// tests/model/test_train.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/cpu/cpu_adamw.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

// Pinned host bytes of the gradient copy (P elements in `dtype`).
uint64_t adamw_offload_serial_grad_bytes(int64_t elements, DType dtype);

class SerialOffloadAdamW final : public Optimizer {
 public:
  // host_threads: threads of the host AdamW (<= 0: every core).
  SerialOffloadAdamW(Backend& backend, const Tensor& flat_values,
                     std::vector<OptimizerPiece> pieces, const OptimizerConfig& config,
                     int host_threads = 0, ops::AdamWSimd simd = ops::AdamWSimd::automatic);
  SerialOffloadAdamW(Backend& backend, const OptimizerParams& params, const OptimizerConfig& config,
                     int host_threads = 0);

  OptimizerPlacement placement() const override { return OptimizerPlacement::offload_serial; }
  // Synchronises `stream` after the gradient copy (the host AdamW needs them); the weight copy
  // back is left queued on `stream`.
  void step(int64_t step, double lr, double grad_scale, Stream& stream) override;
  std::vector<OptimizerState> state() const override { return host_.state(); }
  void load_master_from_weights(Stream& stream) override { host_.load_master_from_weights(stream); }

  int host_threads() const { return adam_.threads(); }
  Tensor master() const { return host_.master(); }  // pinned host, flat like the weights
  Tensor m() const { return host_.m(); }
  Tensor v() const { return host_.v(); }

 private:
  Backend& backend_;
  OptimizerConfig config_;
  HostAdamWState host_;
  OwnedTensor grads_;  // pinned host (P), flat like the weights
  std::vector<ops::CpuAdamW::Segment> segments_;
  ops::CpuAdamW adam_;
};

}  // namespace moepeak::schedules
