// make_optimizer (optimizer.h): the AdamW optimizer.placement names. Test: ctest -R test_train
#include "core/error.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const OptimizerParams& params,
                                          const OptimizerConfig& config, int host_threads) {
  MOEPEAK_CHECK(config.name == OptimizerKind::adamw, "optimizer.name = \"", enum_name(config.name),
                "\" is not available");
  switch (config.placement) {
    case OptimizerPlacement::resident:
      return std::make_unique<ResidentAdamW>(backend, params, config);
    case OptimizerPlacement::offload_serial:
      return std::make_unique<SerialOffloadAdamW>(backend, params, config, host_threads);
    case OptimizerPlacement::offload_stream:
      return std::make_unique<OffloadStreamAdamW>(backend, params, config);
  }
  MOEPEAK_THROW("optimizer.placement: unknown value ", static_cast<int>(config.placement));
}

}  // namespace moepeak::schedules
