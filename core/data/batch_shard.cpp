// rank_batch_block and read_local_batch: see batch_shard.h.
#include "core/data/batch_shard.h"

#include "core/error.h"

namespace moepeak {

BatchBlock rank_batch_block(int64_t batch, int64_t seq_len, int world, int rank,
                            int sequence_parallel) {
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
  BatchBlock block;
  block.rows = batch / groups;
  block.cols = seq_len / sp;
  block.row_begin = (rank / sp) * block.rows;
  block.col_begin = (rank % sp) * block.cols;
  return block;
}

LocalBatch read_local_batch(DataLoader& loader, const BatchBlock& block) {
  LocalBatch local;
  local.batch = block.rows;
  local.local_seq_len = block.cols;
  const auto n = static_cast<size_t>(block.tokens());
  local.input_ids.resize(n);
  local.labels.resize(n);
  local.positions.resize(n);
  loader.read_block(block, local.input_ids.data(), local.labels.data());
  for (int64_t r = 0; r < block.rows; ++r) {
    for (int64_t c = 0; c < block.cols; ++c)
      local.positions[static_cast<size_t>(r * block.cols + c)] = block.col_begin + c;
  }
  return local;
}

int64_t count_scored(const std::vector<int64_t>& labels) {
  int64_t n = 0;
  for (int64_t l : labels) n += l != kIgnoreLabel;
  return n;
}

}  // namespace moepeak
