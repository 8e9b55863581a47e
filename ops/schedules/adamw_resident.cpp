// Resident AdamW (see adamw_resident.h) and the pieces of a store (optimizer.h).
#include "ops/schedules/adamw_resident.h"

#include "core/error.h"
#include "ops/fill.h"

namespace moepeak::schedules {

uint64_t adamw_resident_bytes(int64_t elements, DType dtype) {
  return 2 * DeviceArena::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

std::vector<OptimizerPiece> optimizer_pieces(const ParamStore& params) {
  std::vector<OptimizerPiece> pieces;
  for (size_t i = 0; i < params.layout().params().size(); ++i) {
    // NOTES: RMSNorm weights are not decayed (decay would pull them to 0, not to their init 1).
    pieces.push_back({params.value(static_cast<int>(i)), params.grad(static_cast<int>(i)),
                      !params.layout().params()[i].is_norm});
  }
  return pieces;
}

std::vector<OptimizerPiece> optimizer_pieces(const ZeroParamStore& params) {
  std::vector<OptimizerPiece> pieces;
  for (const auto& p : params.local_pieces()) pieces.push_back({p.value, p.grad, !p.is_norm});
  return pieces;
}

ResidentAdamW::ResidentAdamW(Backend& backend, const Tensor& flat_values,
                             std::vector<OptimizerPiece> pieces, const OptimizerConfig& config)
    : config_(config) {
  const int64_t n = flat_values.numel();
  const size_t elem = dtype_size(flat_values.dtype());
  const char* base = static_cast<const char*>(flat_values.data());
  for (OptimizerPiece& p : pieces) {
    const char* at = static_cast<const char*>(p.value.data());
    MOEPEAK_CHECK(p.value.dtype() == flat_values.dtype() && at >= base &&
                      at + p.value.nbytes() <= base + static_cast<size_t>(n) * elem,
                  "optimizer piece ", p.value.str(), " does not lie in the weights buffer ",
                  flat_values.str());
    slots_.push_back({p, static_cast<int64_t>((at - base) / static_cast<ptrdiff_t>(elem))});
  }
  m_ = OwnedTensor::device(backend, Shape{n}, flat_values.dtype(), LiveSet::optimizer, "adamw m");
  v_ = OwnedTensor::device(backend, Shape{n}, flat_values.dtype(), LiveSet::optimizer, "adamw v");
  ops::fill(m_, 0.0, backend.default_stream());
  ops::fill(v_, 0.0, backend.default_stream());
  backend.default_stream().synchronize();
}

ResidentAdamW::ResidentAdamW(Backend& backend, const ParamStore& params, const OptimizerConfig& config)
    : ResidentAdamW(backend, params.flat_values(), optimizer_pieces(params), config) {}

ResidentAdamW::ResidentAdamW(Backend& backend, const ZeroParamStore& params,
                             const OptimizerConfig& config)
    : ResidentAdamW(backend, params.flat_values(), optimizer_pieces(params), config) {}

Tensor ResidentAdamW::state_view(const OwnedTensor& state, const Slot& slot) const {
  return Tensor(static_cast<char*>(state.data()) + slot.offset * dtype_size(slot.piece.value.dtype()),
                slot.piece.value.shape(), slot.piece.value.dtype(), Placement::device,
                slot.piece.value.backend());
}

void ResidentAdamW::step(int64_t step, double lr, double grad_scale, Stream& stream) {
  const ops::AdamWHyper h = adamw_hyper(config_, step, lr, grad_scale);
  for (const Slot& s : slots_) {
    ops::adamw(s.piece.value, s.piece.grad, state_view(m_, s), state_view(v_, s), h,
                   s.piece.decay, stream);
  }
}

std::vector<OptimizerState> ResidentAdamW::state() const {
  return {{"exp_avg", m_.view()}, {"exp_avg_sq", v_.view()}};
}

}  // namespace moepeak::schedules
