// Resident AdamW (optimizer.placement = "resident"; the reference OffloadStreamAdamW and the
// serial offload are held to): m and v for every parameter piece this rank updates live in
// device memory (live set `optimizer`) next to the weights, and the update runs per piece on the
// compute stream. With fp32 weights the weights are the master copy (ops::adamw updates them in
// place); with bf16 working weights (CUDA) an fp32 master lives beside m and v, and each step is
// ops::adamw_fused: the fp32 update of master, m and v, and the working weights refreshed as the
// new master rounded to bf16.
//
// m and v are flat buffers of the flat weights buffer's length with each piece at the same
// offset (optimizer.h), so a checkpoint stores them as whole tensors gathered like the weights.
//
// Device bytes (live set `optimizer`): adamw_resident_bytes(P, working dtype) = 2·footprint(P·b)
// for f32 / f64 working weights (m, v), 3·footprint(P·4) for bf16 (master, m, v in fp32); P the
// flat buffer's elements (ParamLayout::total_elements on one rank). Test:
// tests/model/test_model_memory.cpp (equal), tests/parallel/test_zero_adamw.cpp (bitwise on
// ZeRO-3 pieces), tests/ops/test_adamw_offload.cpp (the other placements against it).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "ops/adamw.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

// Bytes of resident optimizer state for `elements` parameters with working weights of `working`
// (m and v in that dtype; for bf16 an fp32 master, m and v).
uint64_t adamw_resident_bytes(int64_t elements, DType working);

class ResidentAdamW final : public Optimizer {
 public:
  // flat_values: the buffer every piece's value lies in (m, v mirror its layout).
  ResidentAdamW(Backend& backend, const Tensor& flat_values, std::vector<OptimizerPiece> pieces,
                const OptimizerConfig& config);
  ResidentAdamW(Backend& backend, const OptimizerParams& params, const OptimizerConfig& config);

  OptimizerPlacement placement() const override { return OptimizerPlacement::resident; }
  void step(int64_t step, double lr, double grad_scale, Stream& stream) override;
  std::vector<OptimizerState> state() const override;
  // Nothing with f32 weights (they are the master); with bf16 weights master = their widening.
  void load_master_from_weights(Stream& stream) override;

  Tensor m() const { return m_.view(); }  // flat, same layout as the weights buffer
  Tensor v() const { return v_.view(); }
  // The fp32 master of bf16 working weights (undefined when the weights are the master).
  Tensor master() const override { return master_.view(); }

 private:
  struct Slot {
    OptimizerPiece piece;
    int64_t offset;  // elements from the start of the flat buffers
  };
  Tensor state_view(const OwnedTensor& state, const Slot& slot) const;

  OptimizerConfig config_;
  std::vector<Slot> slots_;
  Tensor flat_values_;
  OwnedTensor m_, v_, master_;
};

}  // namespace moepeak::schedules
