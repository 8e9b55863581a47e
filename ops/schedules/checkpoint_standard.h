// Standard per-layer gradient checkpointing (the reference SCO is held to): each layer's input
// stays on device from forward until its recompute in backward, in the `boundaries` live set.
// This header has the interface through which the model keeps its checkpoint boundaries
// (CheckpointBoundaries), the standard implementation (StandardBoundaries) and its size; SCO,
// the bounded one, is in checkpoint_sco.h. Tests: ctest -R 'test_model_memory|test_sco'.
//
//   boundaries = (L + 1) x N x H x b   layer inputs 0..L-1 and the final hidden state; while
//                                      layer l is recomputed its output replaces the freed
//                                      input of layer l+1, so the count never exceeds L + 1.
// With checkpoint = "none" the same L + 1 tensors are kept (next to every layer's activations).
//
// How the model (core/model/decoder.cpp) drives a CheckpointBoundaries in one step, each tensor
// an (N, H) layer input in the compute dtype:
//   begin(L, (N, H), dtype, for_backward)
//   forward, l = 0..L-1:  x = keep(l, input of layer l); run layer l on x; forward_done(l)
//   head:                 prefetch(L-1)
//   backward, l = L-1..0: x = restore(l); recompute layer l from x; prefetch(l-1);
//                         layer l's backward; release(l)   (layer 0: at end())
//   end()
// keep() takes the tensor right after the work producing it was submitted to the compute
// stream; restore() returns a tensor that work submitted to the compute stream afterwards may
// read. The final hidden state (the last layer's output) stays with the model.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/runtime/arena.h"
#include "core/runtime/dtype.h"
#include "core/runtime/tensor.h"

namespace moepeak::schedules {

inline uint64_t boundaries_standard_bytes(int64_t layers, int64_t tokens, int64_t hidden,
                                          DType dtype) {
  return static_cast<uint64_t>(layers + 1) *
         DeviceArena::footprint(static_cast<uint64_t>(tokens * hidden) * dtype_size(dtype));
}

// Where each checkpointed layer's input lives from its forward to its backward.
class CheckpointBoundaries {
 public:
  virtual ~CheckpointBoundaries() = default;
  // A new step of `layers` layers whose inputs have `shape` (N, H) and `dtype`. With
  // for_backward = false (evaluation) each input is dropped once its layer has run.
  virtual void begin(int layers, const Shape& shape, DType dtype, bool for_backward) = 0;
  // Forward: takes layer l's input (device, live set `boundaries`), whose producing work has been
  // submitted to the compute stream; returns the device view layer l's forward reads.
  virtual Tensor keep(int layer, OwnedTensor input) = 0;
  // Forward: layer l's forward has been submitted; its input may leave the device.
  virtual void forward_done(int layer) = 0;
  // Backward: starts bringing layer l's input back to the device (no-op if it never left).
  virtual void prefetch(int layer) = 0;
  // Backward: layer l's input on the device, readable by work submitted to the compute stream
  // after this call.
  virtual Tensor restore(int layer) = 0;
  // Backward: layer l is done with its input.
  virtual void release(int layer) = 0;
  // End of the step: waits for outstanding copies (rethrowing their errors) and frees the rest.
  virtual void end() = 0;
  // After an error: the same as end() without throwing (for a scope guard).
  virtual void discard() noexcept = 0;
};

// Every input stays on device: exactly the model's behaviour before the interface existed.
class StandardBoundaries final : public CheckpointBoundaries {
 public:
  void begin(int layers, const Shape& /*shape*/, DType /*dtype*/, bool for_backward) override {
    inputs_.clear();
    inputs_.resize(static_cast<size_t>(layers));
    for_backward_ = for_backward;
  }
  Tensor keep(int layer, OwnedTensor input) override {
    OwnedTensor& slot = at(layer);
    slot = std::move(input);
    return slot.view();
  }
  void forward_done(int layer) override {
    if (!for_backward_) at(layer).reset();
  }
  void prefetch(int /*layer*/) override {}
  Tensor restore(int layer) override {
    const OwnedTensor& slot = at(layer);
    MOEPEAK_CHECK(slot.view().defined(), "checkpoint boundary of layer ", layer,
                  " restored but never kept (or already released)");
    return slot.view();
  }
  void release(int layer) override { at(layer).reset(); }
  void end() override { inputs_.clear(); }
  void discard() noexcept override { inputs_.clear(); }

 private:
  OwnedTensor& at(int layer) {
    MOEPEAK_CHECK(layer >= 0 && static_cast<size_t>(layer) < inputs_.size(), "layer ", layer,
                  " is not one of the ", inputs_.size(), " checkpointed layers");
    return inputs_[static_cast<size_t>(layer)];
  }

  std::vector<OwnedTensor> inputs_;  // (N, H) per layer, device
  bool for_backward_ = true;
};

}  // namespace moepeak::schedules
