// What the optimizer updates, taken from the model's parameter stores: the flat weights buffer and
// one piece per tensor this rank updates (ops/schedules/optimizer.h's OptimizerParams). The
// schedules never see the stores; the model hands them this, and make_optimizer
// (ops/schedules/optimizer_choice.h) makes the optimizer optimizer.placement names over it.
//
//   ParamStore (one rank, whole model)   one piece per parameter tensor, in ParamLayout order
//   ZeroParamStore (ZeRO-3 over W ranks) one piece per local piece: this rank's shard of each
//                                        dense tensor and each of its local experts
//
// RMSNorm weights are not decayed (decay would pull them to 0, not to their initial 1).
#pragma once

#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "ops/schedules/optimizer.h"
#include "ops/schedules/optimizer_choice.h"  // make_optimizer over these pieces

namespace moepeak {

schedules::OptimizerParams optimizer_params(const ParamStore& params);
schedules::OptimizerParams optimizer_params(const ZeroParamStore& params);

}  // namespace moepeak
