// Resident AdamW (optimizer.placement = "resident"; the reference OffloadStreamAdamW and the
// serial offload are held to): m and v for every parameter piece this rank updates live in
// device memory (live set `optimizer`) next to the weights, and the update runs per piece on the
// compute stream. With fp32 weights (the CPU backend) the weights are the master copy; bf16
// working weights with an fp32 master arrive with the CUDA backend.
//
// m and v are flat buffers of the flat weights buffer's length with each piece at the same
// offset (optimizer.h), so a checkpoint stores them as whole tensors gathered like the weights.
//
// Device bytes (live set `optimizer`): adamw_resident_bytes(P, dtype) = 2·footprint(P·b), P the
// flat buffer's elements (ParamLayout::total_elements on one rank). Test:
// tests/model/test_model_memory.cpp (equal), tests/parallel/test_zero_adamw.cpp (bitwise on
// ZeRO-3 pieces), tests/ops/test_adamw_offload.cpp (the other placements against it).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/model/mixtral_params.h"
#include "core/model/zero_params.h"
#include "ops/adamw.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

// Bytes of resident optimizer state for `elements` parameters (m and v, in `dtype`).
uint64_t adamw_resident_bytes(int64_t elements, DType dtype);

class ResidentAdamW final : public Optimizer {
 public:
  // flat_values: the buffer every piece's value lies in (m, v mirror its layout).
  ResidentAdamW(Backend& backend, const Tensor& flat_values, std::vector<OptimizerPiece> pieces,
                const OptimizerConfig& config);
  ResidentAdamW(Backend& backend, const ParamStore& params, const OptimizerConfig& config);
  ResidentAdamW(Backend& backend, const ZeroParamStore& params, const OptimizerConfig& config);

  OptimizerPlacement placement() const override { return OptimizerPlacement::resident; }
  void step(int64_t step, double lr, double grad_scale, Stream& stream) override;
  std::vector<OptimizerState> state() const override;
  void load_master_from_weights(Stream& stream) override { stream.synchronize(); }

  Tensor m() const { return m_.view(); }  // flat, same layout as the weights buffer
  Tensor v() const { return v_.view(); }

 private:
  struct Slot {
    OptimizerPiece piece;
    int64_t offset;  // elements from the start of the flat buffers
  };
  Tensor state_view(const OwnedTensor& state, const Slot& slot) const;

  OptimizerConfig config_;
  std::vector<Slot> slots_;
  OwnedTensor m_, v_;
};

}  // namespace moepeak::schedules
