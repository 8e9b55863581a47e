// Resident AdamW (see adamw_resident.h).
#include "ops/schedules/adamw_resident.h"

#include "core/error.h"
#include "ops/adamw_fused.h"
#include "ops/convert.h"
#include "ops/fill.h"
#include "ops/schedules/adamw_host_state.h"

namespace moepeak::schedules {

uint64_t adamw_resident_bytes(int64_t elements, DType working) {
  const uint64_t states = working == DType::bf16 ? 3 : 2;  // (master,) m, v
  return states * DeviceArena::footprint(static_cast<uint64_t>(elements) *
                                         dtype_size(adamw_state_dtype(working)));
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
  const DType working = flat_values.dtype(), state = adamw_state_dtype(working);
  Stream& stream = backend.default_stream();
  flat_values_ = flat_values;
  if (state != working) {
    master_ = OwnedTensor::device(backend, Shape{n}, state, LiveSet::optimizer, "adamw master");
    ops::convert(flat_values, master_, stream);  // bf16 -> fp32 is exact
  }
  m_ = OwnedTensor::device(backend, Shape{n}, state, LiveSet::optimizer, "adamw m");
  v_ = OwnedTensor::device(backend, Shape{n}, state, LiveSet::optimizer, "adamw v");
  ops::fill(m_, 0.0, stream);
  ops::fill(v_, 0.0, stream);
  stream.synchronize();
}

ResidentAdamW::ResidentAdamW(Backend& backend, const OptimizerParams& params,
                             const OptimizerConfig& config)
    : ResidentAdamW(backend, params.flat_values, params.pieces, config) {}

Tensor ResidentAdamW::state_view(const OwnedTensor& state, const Slot& slot) const {
  const DType dtype = state.view().dtype();
  return Tensor(static_cast<char*>(state.data()) + slot.offset * dtype_size(dtype),
                slot.piece.value.shape(), dtype, Placement::device, slot.piece.value.backend());
}

void ResidentAdamW::step(int64_t step, double lr, double grad_scale, Stream& stream) {
  const ops::AdamWHyper h = adamw_hyper(config_, step, lr, grad_scale);
  for (const Slot& s : slots_) {
    if (master_.view().defined()) {
      ops::adamw_fused(state_view(master_, s), s.piece.grad, state_view(m_, s), state_view(v_, s),
                       s.piece.value, h, s.piece.decay, stream);
    } else {
      ops::adamw(s.piece.value, s.piece.grad, state_view(m_, s), state_view(v_, s), h,
                 s.piece.decay, stream);
    }
  }
}

void ResidentAdamW::load_master_from_weights(Stream& stream) {
  if (master_.view().defined()) ops::convert(flat_values_, master_, stream);
  stream.synchronize();
}

std::vector<OptimizerState> ResidentAdamW::state() const {
  std::vector<OptimizerState> s = {{"exp_avg", m_.view()}, {"exp_avg_sq", v_.view()}};
  if (master_.view().defined()) s.push_back({"master", master_.view()});
  return s;
}

}  // namespace moepeak::schedules
