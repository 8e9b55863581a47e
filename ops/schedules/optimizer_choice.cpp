// make_optimizer / optimizer_bytes: the `optimizer` live set's one choice point (see
// optimizer_choice.h). Test: ctest -R 'test_schedule_choice|test_train'
#include "ops/schedules/optimizer_choice.h"

#include <string>

#include "core/error.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"

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

OptimizerBytes optimizer_bytes(const OptimizerConfig& config, int64_t elements, DType working) {
  // The offloaded state is fp32 whatever the working dtype (docs/design.md#the-schedules).
  const DType state = DType::f32;
  const int64_t P = elements;
  const std::string name(enum_name(config.placement));
  const std::string pargs = "(" + formula_args({{"P", P}}) + ")";
  OptimizerBytes out;
  switch (config.placement) {
    case OptimizerPlacement::resident:
      out.device = {adamw_resident_bytes(P, working), "adamw_resident_bytes" + pargs, name};
      return out;
    case OptimizerPlacement::offload_serial:
      out.device = {0, "0 (host AdamW)", name};
      out.host.push_back({"optimizer_state", adamw_offload_host_bytes(P, state),
                          "adamw_offload_host_bytes" + pargs});
      out.host.push_back({"optimizer_grad_copy", adamw_offload_serial_grad_bytes(P, state),
                          "adamw_offload_serial_grad_bytes" + pargs});
      if (const uint64_t w = adamw_offload_serial_weight_bytes(P, working); w > 0) {
        out.host.push_back(
            {"optimizer_weight_copy", w, "adamw_offload_serial_weight_bytes" + pargs});
      }
      return out;
    case OptimizerPlacement::offload_stream: {
      const OffloadStreamShape shape =
          offload_stream_shape(P, config.bucket_params, config.staging_slots);
      out.device = {adamw_offload_stream_bytes(shape.bucket, shape.slots, state),
                    "adamw_offload_stream_bytes(" +
                        formula_args({{"bucket", shape.bucket}, {"slots", shape.slots}}) + ")",
                    name};
      out.host.push_back({"optimizer_state", adamw_offload_host_bytes(P, state),
                          "adamw_offload_host_bytes" + pargs});
      return out;
    }
  }
  MOEPEAK_THROW("optimizer.placement: unknown value ", static_cast<int>(config.placement));
}

}  // namespace moepeak::schedules
