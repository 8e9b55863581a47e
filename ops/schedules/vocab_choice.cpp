// lm_head_sharding / check_vocab_schedule / make_vocab / vocab_bytes: the `logits` live set's one
// choice point (see vocab_choice.h). Test: ctest -R test_schedule_choice
#include "ops/schedules/vocab_choice.h"

#include <string>

#include "core/error.h"
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::schedules {

LmHeadSharding lm_head_sharding(VocabSchedule vocab) {
  switch (vocab) {
    case VocabSchedule::materialized:
      return LmHeadSharding::zero3;
    case VocabSchedule::ring_dtp:
      return LmHeadSharding::vocab_rows;
  }
  MOEPEAK_THROW("schedules.vocab: unknown schedule ", static_cast<int>(vocab));
}

void check_vocab_schedule(const SchedulesConfig& s, int64_t vocab, int world) {
  switch (s.vocab) {
    case VocabSchedule::materialized:
      return;
    case VocabSchedule::ring_dtp:
      if (vocab < world) {
        MOEPEAK_INPUT_ERROR("schedules.vocab = \"ring_dtp\" needs model.vocab_size (", vocab,
                            ") >= the world size (", world, ")");
      }
      return;
  }
  MOEPEAK_THROW("schedules.vocab: unknown schedule ", static_cast<int>(s.vocab));
}

std::unique_ptr<VocabProjection> make_vocab(const SchedulesConfig& s, Backend& backend,
                                            Stream& stream, Comm& comm, DType dtype,
                                            int64_t vocab) {
  switch (s.vocab) {
    case VocabSchedule::materialized:
      return std::make_unique<MaterializedVocab>(backend, stream, dtype);
    case VocabSchedule::ring_dtp:
      return std::make_unique<RingDtpVocab>(backend, stream, comm, dtype, vocab, s.ring_payload,
                                            s.vocab_strip, s.vocab_kept_strips);
  }
  MOEPEAK_THROW("schedules.vocab: unknown schedule ", static_cast<int>(s.vocab));
}

ScheduleBytes vocab_bytes(const SchedulesConfig& s, const VocabShape& v) {
  const std::string name(enum_name(s.vocab));
  switch (s.vocab) {
    case VocabSchedule::materialized:
      return {vocab_materialized_bytes(v.tokens, v.vocab, v.dtype),
              "vocab_materialized_bytes(" + formula_args({{"N", v.tokens}, {"V", v.vocab}}) + ")",
              name};
    case VocabSchedule::ring_dtp:
      return {ring_dtp_bytes(v.tokens, v.hidden, v.vocab, v.world, s.vocab_strip,
                             s.vocab_kept_strips, s.ring_payload, v.dtype),
              "ring_dtp_bytes(" +
                  formula_args({{"N", v.tokens},
                                {"H", v.hidden},
                                {"V", v.vocab},
                                {"P", v.world},
                                {"strip", s.vocab_strip},
                                {"kept", s.vocab_kept_strips}}) +
                  ", " + std::string(enum_name(s.ring_payload)) + ")",
              name};
  }
  MOEPEAK_THROW("schedules.vocab: unknown schedule ", static_cast<int>(s.vocab));
}

}  // namespace moepeak::schedules
