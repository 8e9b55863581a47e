// SCO: selective checkpoint offload of layer inputs to pinned host memory (see checkpoint_sco.h).
#include "ops/schedules/checkpoint_sco.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace moepeak::schedules {

namespace {
uint64_t boundary_bytes(int64_t tokens, int64_t hidden, DType dtype) {
  return static_cast<uint64_t>(tokens * hidden) * dtype_size(dtype);
}
}  // namespace

uint64_t sco_host_bytes(int64_t offloaded, int64_t tokens, int64_t hidden, DType dtype) {
  if (offloaded <= 0) return 0;
  return PinnedPool::footprint(static_cast<uint64_t>(offloaded) *
                               boundary_bytes(tokens, hidden, dtype));
}

int64_t sco_offloaded_layers(int64_t layers, int64_t tokens, int64_t hidden, DType dtype,
                             uint64_t host_budget) {
  // NOTES: every boundary has the same size, so "offload each layer, in forward order, that
  // still fits" stops at the first that does not: S is always a prefix of the layers.
  int64_t offloaded = 0;
  while (offloaded < layers &&
         sco_host_bytes(offloaded + 1, tokens, hidden, dtype) <= host_budget) {
    ++offloaded;
  }
  return offloaded;
}

std::vector<bool> sco_offload_set(int64_t layers, int64_t tokens, int64_t hidden, DType dtype,
                                  uint64_t host_budget) {
  const int64_t offloaded = sco_offloaded_layers(layers, tokens, hidden, dtype, host_budget);
  std::vector<bool> set(static_cast<size_t>(layers), false);
  for (int64_t l = 0; l < offloaded; ++l) set[static_cast<size_t>(l)] = true;
  return set;
}

uint64_t sco_boundaries_bytes(int64_t layers, int64_t offloaded, int64_t tokens, int64_t hidden,
                              DType dtype) {
  if (offloaded <= 0) return boundaries_standard_bytes(layers, tokens, hidden, dtype);
  const uint64_t one = DeviceArena::footprint(boundary_bytes(tokens, hidden, dtype));
  const int64_t kept = layers - offloaded;
  return static_cast<uint64_t>(std::max<int64_t>(2, kept + 1)) * one;
}

uint64_t sco_host_budget(std::optional<uint64_t> configured, const PinnedPool& pool) {
  if (configured) return *configured;
  const uint64_t in_use = pool.stats().current_total();
  return pool.budget() > in_use ? pool.budget() - in_use : 0;
}

ScoBoundaries::ScoBoundaries(Backend& backend, Stream& compute, std::optional<uint64_t> host_budget)
    : backend_(backend),
      compute_(compute),
      host_budget_(host_budget),
      copy_(backend.create_stream("sco copy")),
      compute_mark_(backend.create_event()) {}

ScoBoundaries::~ScoBoundaries() { discard(); }

ScoBoundaries::Boundary& ScoBoundaries::at(int layer) {
  MOEPEAK_CHECK(layer >= 0 && static_cast<size_t>(layer) < layers_.size(), "layer ", layer,
                " is not one of the ", layers_.size(), " checkpointed layers");
  return layers_[static_cast<size_t>(layer)];
}

void ScoBoundaries::copy_after_compute() {
  compute_mark_->record(compute_);
  copy_->wait(*compute_mark_);
}

void ScoBoundaries::begin(int layers, const Shape& shape, DType dtype, bool for_backward) {
  discard();  // whatever an interrupted step left behind
  MOEPEAK_CHECK(shape.ndim() == 2, "checkpoint boundaries are (N, H), not ", shape.str());
  shape_ = shape;
  dtype_ = dtype;
  for_backward_ = for_backward;
  offloaded_count_ = 0;
  layers_.resize(static_cast<size_t>(layers));
  for (Boundary& b : layers_) {
    b.offloaded = b.on_host = b.restoring = false;
    b.host = Tensor();
    if (!b.copied_to_host) b.copied_to_host = backend_.create_event();
    if (!b.copied_to_device) b.copied_to_device = backend_.create_event();
  }
  if (!for_backward) return;  // evaluation: nothing outlives its layer, nothing to offload

  const int64_t N = shape[0], H = shape[1];
  const uint64_t budget = sco_host_budget(host_budget_, backend_.pinned());
  offloaded_count_ = sco_offloaded_layers(layers, N, H, dtype, budget);
  if (offloaded_count_ == 0) return;
  const PinnedPool& pool = backend_.pinned();
  const uint64_t need = sco_host_bytes(offloaded_count_, N, H, dtype);
  const uint64_t in_use = pool.stats().current_total();
  const uint64_t available = pool.budget() > in_use ? pool.budget() - in_use : 0;
  if (need > available) {
    MOEPEAK_THROW("SCO: offloading the inputs of ", offloaded_count_, " of ", layers, " layers (",
                  N, " x ", H, " ", dtype_name(dtype), " each) needs ", format_bytes(need),
                  " of pinned host memory (schedules.sco_host_budget = ", format_bytes(budget),
                  "), but the pinned pool (runtime.pinned_memory = ", format_bytes(pool.budget()),
                  ", ", format_bytes(in_use), " in use) has only ", format_bytes(available),
                  " left; lower schedules.sco_host_budget or raise runtime.pinned_memory");
  }
  host_block_ = OwnedTensor::pinned(backend_, Shape{offloaded_count_, N, H}, dtype,
                                    LiveSet::boundaries, "SCO host copies of layer inputs");
  const size_t stride = static_cast<size_t>(N * H) * dtype_size(dtype);
  for (int64_t l = 0; l < offloaded_count_; ++l) {
    Boundary& b = layers_[static_cast<size_t>(l)];
    b.offloaded = true;
    b.host = Tensor(static_cast<char*>(host_block_.data()) + static_cast<size_t>(l) * stride, shape,
                    dtype, Placement::host, &backend_);
  }
}

Tensor ScoBoundaries::keep(int layer, OwnedTensor input) {
  Boundary& b = at(layer);
  input.view().expect(shape_, dtype_, "checkpoint boundary");
  b.device = std::move(input);
  if (b.offloaded) {
    // The input's producer may still be queued on the compute stream: copy after it.
    copy_after_compute();
    backend_.copy_async(b.host.data(), b.device.data(), b.device.nbytes(), CopyKind::device_to_host,
                        *copy_);
    b.copied_to_host->record(*copy_);
    b.on_host = true;
  }
  return b.device.view();
}

void ScoBoundaries::forward_done(int layer) {
  Boundary& b = at(layer);
  if (!for_backward_) {
    b.device.reset();
    return;
  }
  if (!b.offloaded) return;
  // NOTES: the copy to host reads the device buffer until its event completes. Freed earlier,
  // the buffer's bytes would go to the next allocation, which the compute stream may overwrite
  // before the copy has read them; the host would then hold another tensor's bytes and the
  // backward would recompute from them (test_sco's slow-copy-stream test catches exactly that).
  b.copied_to_host->synchronize();
  b.device.reset();
}

void ScoBoundaries::prefetch(int layer) {
  Boundary& b = at(layer);
  if (!b.offloaded || b.restoring) return;
  MOEPEAK_CHECK(for_backward_ && b.on_host, "the input of layer ", layer,
                " is restored before it was kept in forward");
  b.device =
      OwnedTensor::device(backend_, shape_, dtype_, LiveSet::boundaries, "restored layer input");
  // NOTES: the bytes just allocated may have been freed on the host by a tensor whose last use is
  // still queued on the compute stream (the arena reuses them at once); the copy must land after
  // that use, so the copy stream first waits for the compute stream.
  copy_after_compute();
  backend_.copy_async(b.device.data(), b.host.data(), b.device.nbytes(), CopyKind::host_to_device,
                      *copy_);
  b.copied_to_device->record(*copy_);
  b.restoring = true;
}

Tensor ScoBoundaries::restore(int layer) {
  Boundary& b = at(layer);
  if (b.offloaded) {
    prefetch(layer);  // no-op when already prefetched
    compute_.wait(*b.copied_to_device);
  }
  MOEPEAK_CHECK(b.device.view().defined(), "checkpoint boundary of layer ", layer,
                " restored but never kept (or already released)");
  return b.device.view();
}

void ScoBoundaries::release(int layer) {
  // Only compute-stream work reads a restored or kept input, and it waited for the restoring
  // copy: later users of these bytes are ordered after it (see Buffer's NOTES).
  at(layer).device.reset();
}

void ScoBoundaries::end() {
  copy_->synchronize();  // every copy done (rethrows a copy's error) before the host block goes
  for (Boundary& b : layers_) {
    b.device.reset();
    b.host = Tensor();
  }
  host_block_.reset();
}

void ScoBoundaries::discard() noexcept {
  try {
    copy_->synchronize();
  } catch (...) {
    // The step already failed; its error is the one reported.
  }
  for (Boundary& b : layers_) {
    b.device.reset();
    b.host = Tensor();
  }
  host_block_.reset();
}

}  // namespace moepeak::schedules
