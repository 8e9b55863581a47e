// The choice point of the `optimizer` live set (docs/design.md#the-schedules):
// optimizer.placement mapped to the optimizer the trainer holds (make_optimizer) and to the
// device and pinned host bytes the planner shows (optimizer_bytes):
//
//   optimizer.placement  object              device (optimizer)          host (pinned)
//   resident             ResidentAdamW       adamw_resident_bytes(P, b)  -
//   offload_serial       SerialOffloadAdamW  0                           adamw_offload_host_bytes
//                                                                        + ..._serial_grad_bytes
//                                                                        + ..._serial_weight_bytes
//                                                                          (bf16 weights)
//   offload_stream       OffloadStreamAdamW  adamw_offload_stream_bytes  adamw_offload_host_bytes
//                                            of offload_stream_shape
//
// Contract: the optimizer updates this rank's pieces (OptimizerParams, optimizer.h) in place
// with one element-wise AdamW; its state is fp32 (the CPU optimizers keep it in the compute
// dtype, f32 there; with bf16 working weights the resident state is an fp32 master, m and v).
// Every buffer it allocates is sized by the functions optimizer_bytes names, the ones the
// planner (core/plan/plan.cpp) prints; the trainer (core/train/trainer.cpp) makes the object.
//
// NOTES: adding a placement = one new file (an Optimizer and its bytes functions) + one case in
// each switch of optimizer_choice.cpp; nothing in core/ changes.
// Test: ctest -R test_schedule_choice
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/schedules/optimizer.h"
#include "ops/schedules/schedule_bytes.h"

namespace moepeak::schedules {

// The optimizer optimizer.placement names, over this rank's pieces of `params`.
// host_threads: threads of the serial offload's host AdamW (<= 0: every core).
std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const OptimizerParams& params,
                                          const OptimizerConfig& config, int host_threads = 0);

// The device `optimizer` term (bytes, formula, placement name) and the pinned host terms
// ("optimizer_state", "optimizer_grad_copy", "optimizer_weight_copy" as present) for P = `elements`
// parameter elements of this rank with working weights in `working`.
struct OptimizerBytes {
  ScheduleBytes device;
  std::vector<HostBytes> host;
  uint64_t host_total() const {
    uint64_t t = 0;
    for (const HostBytes& h : host) t += h.bytes;
    return t;
  }
};
OptimizerBytes optimizer_bytes(const OptimizerConfig& config, int64_t elements, DType working);

}  // namespace moepeak::schedules
