#include "ops/schedules/adamw_resident.h"

#include "ops/fill.h"

namespace moepeak::schedules {

uint64_t adamw_resident_bytes(int64_t elements, DType dtype) {
  return 2 * DeviceArena::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

ResidentAdamW::ResidentAdamW(Backend& backend, ParamStore& params, const OptimizerConfig& config)
    : params_(params), config_(config) {
  const int64_t n = params.layout().total_elements();
  m_ = OwnedTensor::device(backend, Shape{n}, params.dtype(), LiveSet::optimizer, "adamw m");
  v_ = OwnedTensor::device(backend, Shape{n}, params.dtype(), LiveSet::optimizer, "adamw v");
  ops::fill(m_, 0.0, backend.default_stream());
  ops::fill(v_, 0.0, backend.default_stream());
  backend.default_stream().synchronize();
}

void ResidentAdamW::step(int64_t step, double lr, double grad_scale, Stream& stream) {
  ops::AdamWHyper h;
  h.lr = lr;
  h.beta1 = config_.beta1;
  h.beta2 = config_.beta2;
  h.eps = config_.eps;
  h.weight_decay = config_.weight_decay;
  h.step = step;
  h.grad_scale = grad_scale;
  const size_t elem = dtype_size(params_.dtype());
  for (size_t i = 0; i < params_.layout().params().size(); ++i) {
    const ParamInfo& p = params_.layout().params()[i];
    auto slice = [&](const OwnedTensor& t) {
      return Tensor(static_cast<char*>(t.data()) + p.offset * elem, p.shape, params_.dtype(),
                    Placement::device, t.view().backend());
    };
    // NOTES: RMSNorm weights are not decayed (decay would pull them to 0, not to their init 1).
    ops::adamw_cpu(params_.value(static_cast<int>(i)), params_.grad(static_cast<int>(i)), slice(m_),
                   slice(v_), h, !p.is_norm, stream);
  }
}

}  // namespace moepeak::schedules
