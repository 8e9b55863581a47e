// RouterBiasBalance: the auxiliary-loss-free balancing's bias update (see router_balance.h).
#include "core/train/router_balance.h"

#include <algorithm>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/router_balance.h"

namespace moepeak {

RouterBiasBalance::RouterBiasBalance(const ParamLayout& layout, double gamma) : gamma_(gamma) {
  MOEPEAK_CHECK(gamma >= 0, "the router bias update rate must be >= 0, got ", gamma);
  bool any = false;
  for (const LayerParamIndex& L : layout.layers) {
    biases_.push_back(L.router_correction_bias);
    any = any || L.router_correction_bias >= 0;
  }
  if (!any) biases_.clear();
  loads_.assign(biases_.size(), {});
}

void RouterBiasBalance::add(const std::vector<std::vector<int64_t>>& expert_load) {
  if (!active()) return;
  MOEPEAK_CHECK(expert_load.size() == biases_.size(), "RouterBiasBalance::add: loads of ",
                expert_load.size(), " layers for a model of ", biases_.size());
  for (size_t l = 0; l < biases_.size(); ++l) {
    if (biases_[l] < 0) continue;
    std::vector<int64_t>& sum = loads_[l];
    if (sum.empty()) sum.assign(expert_load[l].size(), 0);
    MOEPEAK_CHECK(sum.size() == expert_load[l].size(), "RouterBiasBalance::add: layer ", l, " has ",
                  expert_load[l].size(), " experts' loads, not ", sum.size());
    for (size_t e = 0; e < sum.size(); ++e) sum[e] += expert_load[l][e];
  }
}

std::vector<double> RouterBiasBalance::update_of(int layer) const {
  const std::vector<int64_t>& load = loads_.at(static_cast<size_t>(layer));
  // The op's rule applied to a zero bias: the step's change of each expert's bias.
  std::vector<double> delta(load.size(), 0.0);
  ops::update_correction_bias(load, gamma_, delta);
  return delta;
}

void RouterBiasBalance::apply(ZeroParamStore& params, const schedules::Optimizer& optimizer,
                              Stream& stream, bool moved) {
  if (!active()) return;
  if (moved) {
    // The master the optimizer refreshes the working weights from (the offloads keep one even
    // for f32 weights), when it keeps one.
    const Tensor master = optimizer.master();
    const Tensor flat = params.flat_values();
    Backend& backend = params.backend();
    for (size_t l = 0; l < biases_.size(); ++l) {
      const int p = biases_[l];
      if (p < 0 || !params.is_local(p) || loads_[l].empty()) continue;
      const std::vector<double> delta = update_of(static_cast<int>(l));
      const int64_t numel = params.layout().params()[p].shape.numel();
      const int64_t first = params.shard_first(p);
      const int64_t n = std::min(numel, first + params.shard_elements(p)) - first;
      if (n <= 0) continue;  // a shard of padding only
      const Tensor value = params.local_value(p).rows(0, n);
      Tensor source = value;
      if (master.defined()) {
        const int64_t offset =
            (static_cast<const char*>(value.data()) - static_cast<const char*>(flat.data())) /
            static_cast<int64_t>(dtype_size(flat.dtype()));
        source = master.rows(offset, offset + n);
      }
      std::vector<double> v = copy_to_host_as_double(source, backend, stream);
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] += delta[first + i];
      if (master.defined()) copy_from_host_as(v, source, backend, stream);
      if (master.defined()) v = copy_to_host_as_double(source, backend, stream);  // as stored
      copy_from_host_as(v, value, backend, stream);
    }
  }
  for (std::vector<int64_t>& load : loads_) load.clear();
}

}  // namespace moepeak
