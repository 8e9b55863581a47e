// The materialised vocabulary projection (the reference Ring-DTP is held to): the whole
// (N, V) logit matrix is formed, kept from forward to backward in the `logits` live set, and
// turned into the cross-entropy gradient in place.
//
//   x       (N, H)   final-norm hidden states
//   lm_head (V, H)
//   labels  (N)      i64 next-token ids, -100 = not scored
//   loss = sum over scored n of (logsumexp(logits[n]) - logits[n, labels[n]]) * loss_scale
#pragma once

#include <cstdint>

#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/vocab.h"

namespace moepeak::schedules {

// Bytes the materialised projection holds: the (N, V) logits (reused in place as their
// gradient) and the per-token losses.
uint64_t vocab_materialized_bytes(int64_t tokens, int64_t vocab, DType dtype);

class MaterializedVocab final : public VocabProjection {
 public:
  MaterializedVocab(Backend& backend, Stream& stream, DType dtype);

  // Returns the summed loss of the scored tokens times loss_scale (synchronises the stream).
  double forward(const Tensor& x, const Tensor& lm_head, const Tensor& labels,
                 double loss_scale) override;
  // dx (N, H) =, dlm_head (V, H) +=. Releases the logits.
  void backward(const Tensor& x, const Tensor& lm_head, const Tensor& dx,
                const Tensor& dlm_head) override;
  // Drops the logits without a backward (evaluation).
  void release() override;

 private:
  Backend& backend_;
  Stream& stream_;
  DType dtype_;
  double loss_scale_ = 0;
  OwnedTensor logits_;
  Tensor labels_;
};

}  // namespace moepeak::schedules
