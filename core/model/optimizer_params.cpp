// The optimizer's view of the model's stores (see optimizer_params.h).
#include "core/model/optimizer_params.h"

namespace moepeak {

schedules::OptimizerParams optimizer_params(const ParamStore& params) {
  schedules::OptimizerParams out{params.flat_values(), {}};
  for (size_t i = 0; i < params.layout().params().size(); ++i) {
    out.pieces.push_back({params.value(static_cast<int>(i)), params.grad(static_cast<int>(i)),
                          params.layout().params()[i].decays});
  }
  return out;
}

schedules::OptimizerParams optimizer_params(const ZeroParamStore& params) {
  schedules::OptimizerParams out{params.flat_values(), {}};
  for (const auto& p : params.local_pieces()) out.pieces.push_back({p.value, p.grad, p.decays});
  return out;
}

}  // namespace moepeak
