// The choice point of the `logits` live set (docs/design.md#the-schedules): schedules.vocab
// mapped to the vocabulary projection the model runs (make_vocab), to how the LM head is stored
// for it (lm_head_sharding) and to the bytes the planner shows for it (vocab_bytes):
//
//   schedules.vocab  object             LM head     bytes
//   materialized     MaterializedVocab  zero3       vocab_materialized_bytes(N, V)
//   ring_dtp         RingDtpVocab       vocab_rows  ring_dtp_bytes(N, H, V, W, strip, kept,
//   payload)
//
// Contract: the projection takes x (N, H), the LM head as lm_head_sharding stores it and labels
// (N), returns this rank's share of the loss and writes dx (N, H) =, dlm_head += (vocab.h). Every
// buffer it allocates is in `logits` and sized by the function vocab_bytes names, the one the
// planner (core/plan/plan.cpp) prints; DecoderModel (core/model/decoder.cpp) makes the object.
//
// NOTES: adding a vocabulary schedule = one new file (a VocabProjection and its bytes function)
// + one case in each switch of vocab_choice.cpp; nothing in core/ changes.
// Test: ctest -R test_schedule_choice
#pragma once

#include <cstdint>
#include <memory>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/schedules/schedule_bytes.h"
#include "ops/schedules/vocab.h"

namespace moepeak::schedules {

// How the LM head is stored for `vocab` (the parameter store and the planner's `weights` and
// `grads` terms use the same choice): by vocabulary rows for ring_dtp, else ZeRO-3.
LmHeadSharding lm_head_sharding(VocabSchedule vocab);

// Throws an input error (naming the keys) unless schedules.vocab can run on W ranks with a
// vocabulary of `vocab` ids (ring_dtp needs V >= W).
void check_vocab_schedule(const SchedulesConfig& schedules, int64_t vocab, int world);

// The projection of schedules.vocab over a vocabulary of `vocab` ids. Collective for ring_dtp
// (RingDtpVocab duplicates `comm` when W > 1).
std::unique_ptr<VocabProjection> make_vocab(const SchedulesConfig& schedules, Backend& backend,
                                            Stream& stream, Comm& comm, DType dtype, int64_t vocab);

// The shapes the bytes depend on.
struct VocabShape {
  int64_t tokens = 0;  // N, this rank's tokens
  int64_t hidden = 0, vocab = 0;
  int world = 1;  // W (Ring-DTP's P)
  DType dtype = DType::f32;
};

// The `logits` term: bytes, the formula ("vocab_materialized_bytes(N=.., V=..)") and the schedule
// name ("materialized").
ScheduleBytes vocab_bytes(const SchedulesConfig& schedules, const VocabShape& shape);

}  // namespace moepeak::schedules
