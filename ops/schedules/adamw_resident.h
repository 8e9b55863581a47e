// Resident AdamW (the reference OffloadStreamAdamW is held to): m and v for every parameter piece
// this rank updates live in device memory (live set `optimizer`) next to the weights, and the
// update runs per piece on the compute stream. With fp32 weights (the CPU backend) the weights
// are the master copy; bf16 working weights with an fp32 master arrive with the CUDA backend.
//
// A piece is a parameter tensor (one rank: ParamStore) or this rank's part of one (ZeRO-3 shard
// or local expert: ZeroParamStore::local_pieces). Pieces are views into one flat weights buffer;
// m and v are flat buffers of the same length with each piece at the same offset, so a
// checkpoint stores them as two flat tensors in the store's own layout.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/model/mixtral_params.h"
#include "core/model/zero_params.h"
#include "ops/adamw.h"

namespace moepeak::schedules {

// Bytes of resident optimizer state for `elements` parameters (m and v, in `dtype`).
uint64_t adamw_resident_bytes(int64_t elements, DType dtype);

struct OptimizerPiece {
  Tensor value, grad;  // a view into the flat weights buffer and its gradient
  bool decay = true;   // decoupled weight decay applies (not to RMSNorm weights)
};

// Every parameter of a one-rank store, or this rank's pieces of a ZeRO-3 store.
std::vector<OptimizerPiece> optimizer_pieces(const ParamStore& params);
std::vector<OptimizerPiece> optimizer_pieces(const ZeroParamStore& params);

class ResidentAdamW {
 public:
  // flat_values: the buffer every piece's value lies in (m, v mirror its layout).
  ResidentAdamW(Backend& backend, const Tensor& flat_values, std::vector<OptimizerPiece> pieces,
                const OptimizerConfig& config);
  ResidentAdamW(Backend& backend, const ParamStore& params, const OptimizerConfig& config);
  ResidentAdamW(Backend& backend, const ZeroParamStore& params, const OptimizerConfig& config);

  // One update with learning rate `lr` and the clipping factor `grad_scale`; `step` is 1-based.
  void step(int64_t step, double lr, double grad_scale, Stream& stream);

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
