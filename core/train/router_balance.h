// router_balance: DeepSeek-V3's auxiliary-loss-free load balancing (arXiv 2412.19437, section
// 2.1.2) on the routers' e_score_correction_bias (RouterSpec::correction_bias), with
// model.router_bias_update_rate = gamma. After each optimizer step, every expert's bias moves
//     b_e += gamma * sign(mean_load - load_e),   mean_load = sum_e load_e / E,  sign(0) = 0
// (ops::update_correction_bias's rule)
// with load_e the tokens routed to expert e over the step's micro-batches and the whole job
// (DecoderModel::expert_load: the expert group's counts summed over the expert replicas), so every
// rank computes the same update and applies it to the part of the bias it stores (its ZeRO-3
// shard) and, when the optimizer keeps a master (an fp32 one for bf16 weights; the offloads'
// host copy for any), to the master too: the master moves and the working weight is its
// rounding, as after an AdamW step. The bias
// gets no gradient (AdamW leaves it unchanged: zero moments, no weight decay), so this rule is
// the only thing that moves it. A skipped step (a non-finite loss) moves nothing.
//
//   RouterBiasBalance balance(params.layout(), cfg.model.router_bias_update_rate);
//   ... per micro-batch: model.forward_backward(...); balance.add(model.expert_load());
//   ... after the optimizer step: balance.apply(params, optimizer, stream);
// Test: ctest -R test_router_balance (a hand computation over three steps, 1 and 4 ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "ops/schedules/optimizer.h"

namespace moepeak {

class RouterBiasBalance {
 public:
  // gamma = 0, or a model without correction biases: nothing to do (active() is false).
  RouterBiasBalance(const ParamLayout& layout, double gamma);

  bool active() const { return gamma_ > 0 && !biases_.empty(); }
  // Adds one micro-batch's job-wide loads: [layer][expert] (empty for a dense layer).
  void add(const std::vector<std::vector<int64_t>>& expert_load);
  // The step's update of layer `layer`'s bias, per expert (ops/router_balance.h's rule; empty
  // for a layer without loads this step).
  std::vector<double> update_of(int layer) const;
  // Applies the step's updates to this rank's part of every bias (and the optimizer's master),
  // then clears the loads. `moved = false` (a skipped step) only clears them.
  void apply(ZeroParamStore& params, const schedules::Optimizer& optimizer, Stream& stream,
             bool moved = true);

 private:
  double gamma_;
  std::vector<int> biases_;  // per layer: the correction bias's param index, or -1
  std::vector<std::vector<int64_t>> loads_;
};

}  // namespace moepeak
