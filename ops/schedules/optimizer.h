// The optimizer the trainer holds, whatever optimizer.placement says
// (docs/design.md#the-schedules):
//
//   resident        ResidentAdamW (adamw_resident.h): m, v in device memory, the update on the
//                   compute stream; with fp32 working weights the weights are the master. The
//                   reference the other two are held to.
//   offload_serial  SerialOffloadAdamW (adamw_offload_serial.h): master, m, v in pinned host
//                   memory; grads device->host, a vectorised multi-threaded host AdamW, working
//                   weights host->device, one after the other (ZeRO-Offload's schedule).
//   offload_stream  OffloadStreamAdamW (adamw_offload_stream.h): master, m, v in pinned host
//                   memory, streamed through s device slots of beta elements on three streams.
//
// All three run the same element-wise update (ops/adamw.h), so after any number of steps their
// weights, m and v are bitwise equal; a checkpoint saved under one placement resumes under any
// other.
//
// Checkpoints (core/checkpoint/train_checkpoint.*) go through this interface: state() lists the
// flat tensors to save as "<name>.<param name>", and after loading the working weights,
// load_master_from_weights() re-derives a master that the checkpoint does not carry.
//
// A piece is a parameter tensor (one rank: ParamStore) or this rank's part of one (ZeRO-3 shard
// or local expert: ZeroParamStore::local_pieces); the model's stores hand them over as
// OptimizerParams (core/model/optimizer_params.h). Pieces are views into one flat weights buffer,
// and every flat state buffer mirrors that layout (each piece at the same element offset), so a
// checkpoint gathers state exactly as it gathers weights. Test: tests/ops/test_adamw_offload.cpp,
// tests/model/test_train.cpp, tests/parallel/test_adamw_offload_parallel.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/adamw.h"

namespace moepeak::schedules {

struct OptimizerPiece {
  Tensor value, grad;  // a view into the flat weights buffer and its gradient
  bool decay = true;   // decoupled weight decay applies (not to RMSNorm weights)
};

// What an optimizer updates: the flat weights buffer and the pieces in it (each piece's value a
// view into flat_values, its grad the matching view of the flat gradients).
struct OptimizerParams {
  Tensor flat_values;
  std::vector<OptimizerPiece> pieces;
};

// The element-wise kernel's hyper-parameters for one step.
inline ops::AdamWHyper adamw_hyper(const OptimizerConfig& config, int64_t step, double lr,
                                   double grad_scale) {
  ops::AdamWHyper h;
  h.lr = lr;
  h.beta1 = config.beta1;
  h.beta2 = config.beta2;
  h.eps = config.eps;
  h.weight_decay = config.weight_decay;
  h.step = step;
  h.grad_scale = grad_scale;
  return h;
}

// One flat state tensor a checkpoint saves: "exp_avg" (m), "exp_avg_sq" (v), or "master".
// `flat` has the element count of the flat weights buffer with each piece at the same offset;
// it may be device memory or pinned host memory (flat.placement()) and its dtype may differ from
// the weights' (fp32 master and moments beside bf16 working weights).
struct OptimizerState {
  std::string name;
  Tensor flat;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual OptimizerPlacement placement() const = 0;

  // One update with learning rate `lr` and the clipping factor `grad_scale`; `step` is 1-based.
  // Reads the gradients and writes the working weights in `stream`'s order: work submitted to
  // `stream` afterwards sees the new weights.
  virtual void step(int64_t step, double lr, double grad_scale, Stream& stream) = 0;

  // What a checkpoint saves. "master" is listed only when the working weights do not carry every
  // bit of the master (bf16 working weights); with working weights of the master's dtype the
  // master equals them bit for bit after every step, and the checkpoint's weights restore it.
  virtual std::vector<OptimizerState> state() const = 0;

  // The fp32 (or the working dtype's) master weights each step updates and the working weights
  // are refreshed from, flat like the weights buffer (device or pinned host memory); undefined
  // when the working weights are the master themselves (resident AdamW on f32 / f64 weights).
  // A change made to a weight between steps must be made to the master too, or the next step
  // overwrites it (core/train/router_balance.h).
  virtual Tensor master() const = 0;

  // Sets the master from the working weights (after a checkpoint load replaced the weights and
  // carried no "master"). No-op when the working weights are the master (resident).
  // Synchronises `stream`.
  virtual void load_master_from_weights(Stream& stream) = 0;
};

// make_optimizer, the optimizer optimizer.placement names, and its bytes: optimizer_choice.h.

}  // namespace moepeak::schedules
