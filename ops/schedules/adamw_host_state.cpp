// HostAdamWState: see adamw_host_state.h. Test: ctest -R test_adamw_offload
#include "ops/schedules/adamw_host_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace moepeak::schedules {

uint64_t adamw_offload_host_bytes(int64_t elements, DType dtype) {
  return 3 * PinnedPool::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

HostAdamWState::HostAdamWState(Backend& backend, const Tensor& flat_values,
                               std::vector<OptimizerPiece> pieces, const char* who)
    : backend_(&backend), flat_values_(flat_values), pieces_(std::move(pieces)) {
  const DType dtype = flat_values.dtype();
  MOEPEAK_CHECK(
      dtype == DType::f32 || dtype == DType::f64, who,
      " keeps the master weights in the working weights' dtype on this backend (f32, or "
      "f64 in tests); got working weights ",
      flat_values.str(),
      " (bf16 working weights with an fp32 master need the CUDA kernels, which are not in "
      "this version)");
  const size_t b = dtype_size(dtype);
  const int64_t n = flat_values.numel();
  const char* base = static_cast<const char*>(flat_values.data());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const OptimizerPiece& p = pieces_[i];
    const char* at = static_cast<const char*>(p.value.data());
    MOEPEAK_CHECK(p.value.dtype() == dtype && p.grad.dtype() == dtype &&
                      p.grad.numel() == p.value.numel() && at >= base &&
                      at + p.value.nbytes() <= base + static_cast<size_t>(n) * b,
                  who, ": piece ", p.value.str(), " (grad ", p.grad.str(),
                  ") does not lie in the weights buffer ", flat_values.str());
    segments_.push_back({static_cast<int>(i),
                         static_cast<int64_t>((at - base) / static_cast<ptrdiff_t>(b)),
                         p.value.numel(), p.decay});
  }
  std::sort(segments_.begin(), segments_.end(),
            [](const Segment& a, const Segment& c) { return a.offset < c.offset; });
  for (size_t i = 1; i < segments_.size(); ++i) {
    MOEPEAK_CHECK(segments_[i - 1].offset + segments_[i - 1].length <= segments_[i].offset, who,
                  ": pieces overlap at element ", segments_[i].offset, " of the weights buffer");
  }
  master_ =
      OwnedTensor::pinned(backend, Shape{n}, dtype, LiveSet::optimizer, "adamw master (host)");
  m_ = OwnedTensor::pinned(backend, Shape{n}, dtype, LiveSet::optimizer, "adamw m (host)");
  v_ = OwnedTensor::pinned(backend, Shape{n}, dtype, LiveSet::optimizer, "adamw v (host)");
  std::memset(m_.data(), 0, m_.nbytes());
  std::memset(v_.data(), 0, v_.nbytes());
  load_master_from_weights(backend.default_stream());
}

std::vector<OptimizerState> HostAdamWState::state() const {
  std::vector<OptimizerState> s = {{"exp_avg", m_.view()}, {"exp_avg_sq", v_.view()}};
  // NOTES: with working weights of the master's dtype the master is bitwise the working weights
  // after every step (the update writes both from one value), so the checkpoint's weights
  // restore it; only a narrower working dtype would need the master saved.
  if (master_.view().dtype() != flat_values_.dtype()) s.push_back({"master", master_.view()});
  return s;
}

void HostAdamWState::load_master_from_weights(Stream& stream) {
  backend_->copy_async(master_.data(), flat_values_.data(), flat_values_.nbytes(),
                       CopyKind::device_to_host, stream);
  stream.synchronize();
}

}  // namespace moepeak::schedules
