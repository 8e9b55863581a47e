#include "ops/schedules/vocab_materialized.h"

#include <vector>

#include "core/error.h"
#include "core/runtime/stream_profile.h"
#include "ops/cross_entropy.h"
#include "ops/linear.h"

namespace moepeak::schedules {

uint64_t vocab_materialized_bytes(int64_t tokens, int64_t vocab, DType dtype) {
  uint64_t b = dtype_size(dtype);
  return DeviceArena::footprint(static_cast<uint64_t>(tokens * vocab) * b) +
         DeviceArena::footprint(static_cast<uint64_t>(tokens) * b);
}

MaterializedVocab::MaterializedVocab(Backend& backend, Stream& stream, DType dtype)
    : backend_(backend), stream_(stream), dtype_(dtype) {}

double MaterializedVocab::forward(const Tensor& x, const Tensor& lm_head, const Tensor& labels,
                                  double loss_scale) {
  const StreamTrafficTag traffic("vocab");
  const int64_t N = x.size(0), V = lm_head.size(0);
  loss_scale_ = loss_scale;
  labels_ = labels;
  logits_ = OwnedTensor::device(backend_, Shape{N, V}, dtype_, LiveSet::logits, "logits");
  OwnedTensor losses =
      OwnedTensor::device(backend_, Shape{N}, dtype_, LiveSet::logits, "token losses");
  ops::linear_forward(x, lm_head, logits_, false, stream_);
  ops::cross_entropy_forward(logits_, labels, losses, stream_);
  double sum = 0;  // in token order, in double
  for (double loss : copy_to_host_as_double(losses, backend_, stream_)) sum += loss;
  return sum * loss_scale;
}

void MaterializedVocab::backward(const Tensor& x, const Tensor& lm_head, const Tensor& dx,
                                 const Tensor& dlm_head) {
  const StreamTrafficTag traffic("vocab");
  MOEPEAK_CHECK(logits_.view().defined(), "vocab backward without a forward to go with it");
  ops::cross_entropy_backward(logits_, labels_, loss_scale_, logits_, stream_);  // in place
  ops::linear_backward(x, lm_head, logits_, dx, false, dlm_head, stream_);
  logits_.reset();
}

void MaterializedVocab::release() {
  logits_.reset();
  labels_ = Tensor();
}

}  // namespace moepeak::schedules
