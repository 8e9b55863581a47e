#include "core/data/batch_shard.h"

#include "core/data/data_loader.h"
#include "core/error.h"

namespace moepeak {

LocalBatch shard_batch(const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                       int64_t batch, int64_t seq_len, int world, int rank, int sequence_parallel) {
  MOEPEAK_CHECK(world >= 1 && rank >= 0 && rank < world, "rank ", rank, " of ", world);
  const int sp = sequence_parallel == 0 ? world : sequence_parallel;
  MOEPEAK_CHECK(sp >= 1 && world % sp == 0, "sequence_parallel ", sp, " does not divide ", world);
  if (seq_len % sp != 0) {
    MOEPEAK_INPUT_ERROR("training.seq_len = ", seq_len, " cannot be split over ", sp,
                        " ranks (sequence parallelism needs seq_len % Sp == 0; ", seq_len, " % ",
                        sp, " = ", seq_len % sp, ")");
  }
  const int groups = world / sp;
  if (batch % groups != 0) {
    MOEPEAK_INPUT_ERROR("training.batch_size = ", batch, " cannot be split over ", groups,
                        " sequence groups (W/Sp = ", world, "/", sp, ")");
  }
  const size_t total = static_cast<size_t>(batch * seq_len);
  MOEPEAK_CHECK(input_ids.size() == total && labels.size() == total, "a batch of ", batch, " x ",
                seq_len, " needs ", total, " ids and labels, got ", input_ids.size(), " and ",
                labels.size());
  LocalBatch local;
  local.batch = batch / groups;
  local.local_seq_len = seq_len / sp;
  const int64_t first_seq = (rank / sp) * local.batch;
  const int64_t begin = (rank % sp) * local.local_seq_len;
  for (int64_t b = first_seq; b < first_seq + local.batch; ++b) {
    for (int64_t t = begin; t < begin + local.local_seq_len; ++t) {
      local.input_ids.push_back(input_ids[b * seq_len + t]);
      local.labels.push_back(labels[b * seq_len + t]);
      local.positions.push_back(t);
    }
  }
  return local;
}

int64_t count_scored(const std::vector<int64_t>& labels) {
  int64_t n = 0;
  for (int64_t l : labels) n += l != kIgnoreLabel;
  return n;
}

}  // namespace moepeak
