// SerialOffloadAdamW (optimizer.placement = "offload_serial"): the CPU-offload baseline as
// ZeRO-Offload runs it — master weights, m and v in pinned host memory (HostAdamWState), and per
// step, one stage after the other:
//   1. gradients device -> host (each piece into a pinned host gradient buffer), wait;
//   2. the host AdamW (ops/cpu/cpu_adamw.h: AVX2, a pool of host threads, like DeepSpeed's
//      CPU Adam) over master, m, v; with bf16 working weights it also writes the new master
//      rounded to bf16 into a pinned host weight buffer, tile by tile;
//   3. the new working weights host -> device: the master itself (f32 / f64 working weights), or
//      that bf16 buffer (half the bytes of the master).
// The device is idle during 2; nothing overlaps — the schedule OffloadStreamAdamW improves on.
//
// Working weights f32 or f64 (state of that dtype), or bf16 with an fp32 master, m, v and fp32
// gradients (the main gradients, schedules::main_grad_dtype) — what a bf16 run has. Other
// combinations throw naming the dtypes.
//
// Device bytes (live set `optimizer`): 0. Pinned host bytes: adamw_offload_host_bytes(P, state)
// in `optimizer` + adamw_offload_serial_grad_bytes(P, state) in `grads` +
// adamw_offload_serial_weight_bytes(P, working) in `weights` (0 unless the weights are bf16).
// Exactness: the host AdamW computes the element-wise kernel of ops/adamw.h bit for bit and
// rounds to bf16 as adamw_fused does, so weights, master, m and v equal ResidentAdamW's after any
// number of steps.
// Test: tests/ops/test_adamw_offload.cpp, tests/parallel/test_adamw_offload_parallel.cpp,
// tests/model/test_train.cpp, tests/ops/backend_ops/schedules_check.cpp (f32 and bf16).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/cpu/cpu_adamw.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

// Pinned host bytes of the gradient copy (P elements in `dtype`, the state's).
uint64_t adamw_offload_serial_grad_bytes(int64_t elements, DType dtype);
// Pinned host bytes of the working-weight copy for weights in `working`: P bf16 elements for
// bf16 working weights, 0 otherwise (the master itself is copied up).
uint64_t adamw_offload_serial_weight_bytes(int64_t elements, DType working);

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
  Tensor master() const override { return host_.master(); }  // pinned host, flat
  Tensor m() const { return host_.m(); }
  Tensor v() const { return host_.v(); }

 private:
  Backend& backend_;
  OptimizerConfig config_;
  HostAdamWState host_;
  OwnedTensor grads_;    // pinned host (P) in the state dtype, flat like the weights
  OwnedTensor weights_;  // pinned host (P) bf16 working weights, flat; none for f32 / f64
  std::vector<ops::CpuAdamW::Segment> segments_;
  ops::CpuAdamW adam_;
};

}  // namespace moepeak::schedules
