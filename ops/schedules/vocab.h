// The vocabulary-projection interface the model's head calls (docs/design.md#the-schedules): the
// LM head's logits and the cross-entropy over them, forward and backward. Implementations:
//   MaterializedVocab  the (N, V) logits formed and kept         (vocab_materialized.h)
//   RingDtpVocab       logit strips over a ring of the W ranks   (vocab_ring_dtp.h)
// The model picks one from schedules.vocab (make_vocab, vocab_choice.h).
//
//   x        (N, H)   this rank's final-norm hidden states
//   lm_head  the LM head as lm_head_sharding stores it: the whole (V, H) under zero3 (gathered),
//            this rank's rows (V_r, H) under vocab_rows (never gathered); its gradient likewise
//   labels   (N)      i64 next-token ids, -100 = not scored
//   loss = loss_scale * sum over this rank's scored tokens of (logsumexp(logits[n]) - logit of
//          the label); the caller all-reduces it over the ranks
#pragma once

#include "core/runtime/tensor.h"

namespace moepeak::schedules {

// How the model's parameter store keeps the LM head for a vocabulary schedule: ZeRO-3 like every
// dense tensor, or by vocabulary rows (Ring-DTP: rank r holds rows vocab_shard(V, W, r)).
enum class LmHeadSharding { zero3, vocab_rows };

class VocabProjection {
 public:
  virtual ~VocabProjection() = default;
  // Returns the loss above; keeps what backward needs until backward() or release().
  virtual double forward(const Tensor& x, const Tensor& lm_head, const Tensor& labels,
                         double loss_scale) = 0;
  // dx (N, H) =, dlm_head += (the lm_head's layout). Releases what forward kept.
  virtual void backward(const Tensor& x, const Tensor& lm_head, const Tensor& dx,
                        const Tensor& dlm_head) = 0;
  // Drops what forward kept without a backward (evaluation, or after an error). No-op when
  // nothing is kept.
  virtual void release() = 0;
};

}  // namespace moepeak::schedules
