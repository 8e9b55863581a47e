// SerialOffloadAdamW: see adamw_offload_serial.h. Test: ctest -R adamw_offload
#include "ops/schedules/adamw_offload_serial.h"

#include <cstring>

#include "core/error.h"

namespace moepeak::schedules {

uint64_t adamw_offload_serial_grad_bytes(int64_t elements, DType dtype) {
  return PinnedPool::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

uint64_t adamw_offload_serial_weight_bytes(int64_t elements, DType working) {
  if (working != DType::bf16) return 0;
  return PinnedPool::footprint(static_cast<uint64_t>(elements) * dtype_size(working));
}

SerialOffloadAdamW::SerialOffloadAdamW(Backend& backend, const Tensor& flat_values,
                                       std::vector<OptimizerPiece> pieces,
                                       const OptimizerConfig& config, int host_threads,
                                       ops::AdamWSimd simd)
    : backend_(backend),
      config_(config),
      host_(backend, flat_values, std::move(pieces), "SerialOffloadAdamW"),
      adam_(host_threads, simd) {
  // HostAdamWState admits f32 / f64 working weights with state of their dtype and bf16 ones
  // with an fp32 state and fp32 gradients: the three this optimizer runs.
  if (host_.working_dtype() == DType::bf16) {
    weights_ = OwnedTensor::pinned(backend, Shape{host_.elements()}, DType::bf16, LiveSet::weights,
                                   "adamw bf16 weights (host)");
    // NOTES: like the gradient copy's padding below: never written by the host AdamW (no
    // segment covers it) and never copied up, zeroed so the buffer holds no uninitialised bytes.
    std::memset(weights_.data(), 0, weights_.nbytes());
  }
  grads_ = OwnedTensor::pinned(backend, Shape{host_.elements()}, host_.dtype(), LiveSet::grads,
                               "adamw grads (host)");
  // NOTES: padding between pieces is never copied in; zero it once so the buffer holds no
  // uninitialised bytes (the host AdamW does not read it either).
  std::memset(grads_.data(), 0, grads_.nbytes());
  for (const HostAdamWState::Segment& s : host_.segments()) {
    segments_.push_back({s.offset, s.length, s.decay});
  }
}

SerialOffloadAdamW::SerialOffloadAdamW(Backend& backend, const OptimizerParams& params,
                                       const OptimizerConfig& config, int host_threads)
    : SerialOffloadAdamW(backend, params.flat_values, params.pieces, config, host_threads) {}

void SerialOffloadAdamW::step(int64_t step, double lr, double grad_scale, Stream& stream) {
  const ops::AdamWHyper hyper = adamw_hyper(config_, step, lr, grad_scale);
  MOEPEAK_CHECK(hyper.step >= 1, "SerialOffloadAdamW: step ", hyper.step, " (steps count from 1)");
  const size_t b = dtype_size(host_.dtype());
  char* grads = static_cast<char*>(grads_.data());
  char* master = static_cast<char*>(host_.master().data());
  // 1. gradients device -> host.
  for (const HostAdamWState::Segment& s : host_.segments()) {
    const OptimizerPiece& p = host_.pieces()[static_cast<size_t>(s.piece)];
    backend_.copy_async(grads + static_cast<size_t>(s.offset) * b, p.grad.data(), p.grad.nbytes(),
                        CopyKind::device_to_host, stream);
  }
  stream.synchronize();
  // 2. the host AdamW (and the bf16 working weights, tile by tile).
  bf16* working = weights_.data() ? weights_.view().data_as<bf16>() : nullptr;
  if (host_.dtype() == DType::f32) {
    adam_.step<float>(host_.master().data_as<float>(), grads_.data_as<float>(),
                      host_.m().data_as<float>(), host_.v().data_as<float>(), segments_, hyper,
                      working);
  } else {
    adam_.step<double>(host_.master().data_as<double>(), grads_.data_as<double>(),
                       host_.m().data_as<double>(), host_.v().data_as<double>(), segments_, hyper);
  }
  // 3. the new working weights host -> device: the master, or its bf16 rounding.
  const char* up = working ? static_cast<const char*>(weights_.data()) : master;
  const size_t up_b = dtype_size(host_.working_dtype());
  for (const HostAdamWState::Segment& s : host_.segments()) {
    const OptimizerPiece& p = host_.pieces()[static_cast<size_t>(s.piece)];
    backend_.copy_async(p.value.data(), up + static_cast<size_t>(s.offset) * up_b, p.value.nbytes(),
                        CopyKind::host_to_device, stream);
  }
}

}  // namespace moepeak::schedules
