// Resident AdamW (the reference OffloadStreamAdamW is held to): m and v for every parameter of
// this rank live in device memory (live set `optimizer`) next to the weights, and the update
// runs per parameter tensor on the compute stream. With fp32 weights (the CPU backend) the
// weights are the master copy; bf16 working weights with an fp32 master arrive with the CUDA
// backend.
#pragma once

#include <cstdint>

#include "core/config/config.h"
#include "core/model/mixtral_params.h"
#include "ops/adamw.h"

namespace moepeak::schedules {

// Bytes of resident optimizer state for `elements` parameters (m and v, in `dtype`).
uint64_t adamw_resident_bytes(int64_t elements, DType dtype);

class ResidentAdamW {
 public:
  ResidentAdamW(Backend& backend, ParamStore& params, const OptimizerConfig& config);

  // One update with learning rate `lr` and the clipping factor `grad_scale`; `step` is 1-based.
  void step(int64_t step, double lr, double grad_scale, Stream& stream);

  Tensor m() const { return m_.view(); }  // flat, same layout as the parameters
  Tensor v() const { return v_.view(); }

 private:
  ParamStore& params_;
  OptimizerConfig config_;
  OwnedTensor m_, v_;
};

}  // namespace moepeak::schedules
