// rank_batch_block and read_local_batch: see batch_shard.h.
#include "core/data/batch_shard.h"

#include <algorithm>

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

LocalBatch read_local_batch(DataLoader& loader, const BatchBlock& block,
                            const DocumentOptions& documents) {
  LocalBatch local;
  local.batch = block.rows;
  local.local_seq_len = block.cols;
  const auto n = static_cast<size_t>(block.tokens());
  local.input_ids.resize(n);
  local.labels.resize(n);
  local.positions.resize(n);
  if (!documents.enabled()) {
    loader.read_block(block, local.input_ids.data(), local.labels.data());
    for (int64_t r = 0; r < block.rows; ++r) {
      for (int64_t c = 0; c < block.cols; ++c)
        local.positions[static_cast<size_t>(r * block.cols + c)] = block.col_begin + c;
    }
    return local;
  }
  const int64_t T = loader.seq_len(), cols = block.cols;
  const bool eos = documents.boundaries == DocumentBoundaries::eos;
  std::vector<int64_t> row_ids, row_labels;  // boundaries = eos: the whole rows (rows, T)
  if (eos) {
    const BatchBlock rows{block.row_begin, block.rows, 0, T};
    row_ids.resize(static_cast<size_t>(rows.tokens()));
    row_labels.resize(static_cast<size_t>(rows.tokens()));
    loader.read_block(rows, row_ids.data(), row_labels.data());
  } else {
    loader.read_block(block, local.input_ids.data(), local.labels.data());
  }
  if (documents.mask) local.doc_start.resize(static_cast<size_t>(block.rows * T));
  std::vector<int32_t> scratch(documents.mask ? 0 : static_cast<size_t>(T));
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < block.rows; ++r) {
    const size_t out = static_cast<size_t>(r * cols);
    starts.clear();
    if (eos) {
      const int64_t* ids = row_ids.data() + r * T;
      eos_document_starts({ids, static_cast<size_t>(T)}, documents.eos_token_id, starts);
      std::copy_n(ids + block.col_begin, cols, local.input_ids.data() + out);
      std::copy_n(row_labels.data() + r * T + block.col_begin, cols, local.labels.data() + out);
    } else {
      loader.read_document_starts(block.row_begin + r, starts);
    }
    int32_t* doc_start = documents.mask ? local.doc_start.data() + r * T : scratch.data();
    document_start_of_positions(starts, T, doc_start);
    apply_documents(documents, starts, doc_start, block.col_begin, cols,
                    local.positions.data() + out, local.labels.data() + out);
  }
  return local;
}

int64_t count_scored(const std::vector<int64_t>& labels) {
  int64_t n = 0;
  for (int64_t l : labels) n += l != kIgnoreLabel;
  return n;
}

}  // namespace moepeak
