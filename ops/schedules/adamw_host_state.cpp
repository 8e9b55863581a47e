// HostAdamWState: see adamw_host_state.h. Test: ctest -R test_adamw_offload
#include "ops/schedules/adamw_host_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak::schedules {

uint64_t adamw_offload_host_bytes(int64_t elements, DType dtype) {
  return 3 * PinnedPool::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

DType adamw_state_dtype(DType working) { return working == DType::bf16 ? DType::f32 : working; }

HostAdamWState::HostAdamWState(Backend& backend, const Tensor& flat_values,
                               std::vector<OptimizerPiece> pieces, const char* who)
    : backend_(&backend), flat_values_(flat_values), pieces_(std::move(pieces)) {
  const DType working = flat_values.dtype();
  MOEPEAK_CHECK(working == DType::f32 || working == DType::f64 || working == DType::bf16, who,
                ": working weights ", flat_values.str(),
                " (f32 or f64 expected; bf16 with an fp32 master)");
  const DType dtype = adamw_state_dtype(working);
  const size_t b = dtype_size(working);
  const int64_t n = flat_values.numel();
  const char* base = static_cast<const char*>(flat_values.data());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const OptimizerPiece& p = pieces_[i];
    const char* at = static_cast<const char*>(p.value.data());
    MOEPEAK_CHECK(p.value.dtype() == working && p.grad.dtype() == main_grad_dtype(working) &&
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
  if (flat_values_.dtype() == master_.view().dtype()) {
    backend_->copy_async(master_.data(), flat_values_.data(), flat_values_.nbytes(),
                         CopyKind::device_to_host, stream);
    stream.synchronize();
    return;
  }
  // bf16 working weights: the fp32 master is their exact widening.
  const std::vector<double> values = copy_to_host_as_double(flat_values_, *backend_, stream);
  float* master = master_.view().data_as<float>();
  for (size_t i = 0; i < values.size(); ++i) master[i] = static_cast<float>(values[i]);
}

}  // namespace moepeak::schedules
