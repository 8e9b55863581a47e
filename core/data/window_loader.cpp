// TokenWindowLoader: see window_loader.h for the two orders and the state.
#include "core/data/window_loader.h"

#include <algorithm>

#include "core/data/window_permutation.h"
#include "core/error.h"

namespace moepeak {

namespace {
constexpr size_t kFileOrderFields = 2;  // [token offset, N]
constexpr size_t kShuffledFields = 4;   // [sample index, N, T, seed]
}  // namespace

TokenWindowLoader::TokenWindowLoader(TokenDataset dataset, int64_t batch_size, int64_t seq_len,
                                     int64_t vocab_size, WindowOrder order)
    : dataset_(std::move(dataset)),
      batch_size_(batch_size),
      seq_len_(seq_len),
      vocab_size_(vocab_size),
      order_(order) {
  if (batch_size < 1)
    MOEPEAK_INPUT_ERROR(dataset_.path(), ": training.batch_size ", batch_size, " must be >= 1");
  if (seq_len < 1)
    MOEPEAK_INPUT_ERROR(dataset_.path(), ": training.seq_len ", seq_len, " must be >= 1");
  if (dataset_.token_count() < static_cast<uint64_t>(seq_len) + 1) {
    MOEPEAK_INPUT_ERROR(dataset_.path(), ": ", dataset_.token_count(),
                        " tokens, fewer than training.seq_len + 1 = ", seq_len + 1,
                        " (one window of inputs and labels)");
  }
  if (order_.shuffle)
    windows_per_epoch_ = (dataset_.token_count() - 1) / static_cast<uint64_t>(seq_len);
}

uint64_t TokenWindowLoader::window_start(uint64_t ahead) const {
  const uint64_t N = dataset_.token_count();
  const uint64_t T = static_cast<uint64_t>(seq_len_);
  if (!order_.shuffle)
    return static_cast<uint64_t>((cursor_ + static_cast<unsigned __int128>(ahead) * T) % N);
  const uint64_t sample = cursor_ + ahead;
  const uint64_t n = windows_per_epoch_;
  return T * WindowPermutation(n, order_.seed, sample / n)(sample % n);
}

void TokenWindowLoader::read_window(uint64_t ahead, int64_t col_begin, int64_t cols,
                                    int64_t* input_ids, int64_t* labels) {
  MOEPEAK_CHECK(col_begin >= 0 && cols >= 1 && col_begin + cols <= seq_len_, "columns [", col_begin,
                ", ", col_begin + cols, ") of a window of ", seq_len_);
  window_.resize(static_cast<size_t>(cols) + 1);
  const uint64_t begin =
      (window_start(ahead) + static_cast<uint64_t>(col_begin)) % dataset_.token_count();
  dataset_.read_cyclic(begin, static_cast<uint64_t>(cols) + 1, window_.data(), vocab_size_);
  std::copy(window_.begin(), window_.end() - 1, input_ids);
  std::copy(window_.begin() + 1, window_.end(), labels);
}

void TokenWindowLoader::read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) {
  check_block(block, batch_size_, seq_len_);
  for (int64_t r = 0; r < block.rows; ++r) {
    read_window(static_cast<uint64_t>(block.row_begin + r), block.col_begin, block.cols,
                input_ids + r * block.cols, labels + r * block.cols);
  }
}

void TokenWindowLoader::document_starts(uint64_t ahead, std::vector<int64_t>& starts) const {
  dataset_.document_starts(window_start(ahead), static_cast<uint64_t>(seq_len_), starts);
}

void TokenWindowLoader::read_document_starts(int64_t row, std::vector<int64_t>& starts) {
  MOEPEAK_CHECK(row >= 0 && row < batch_size_, "row ", row, " of a batch of ", batch_size_);
  if (!dataset_.has_document_index()) throw_no_document_index(describe());
  document_starts(static_cast<uint64_t>(row), starts);
}

void TokenWindowLoader::skip(uint64_t samples) {
  if (order_.shuffle) {
    cursor_ += samples;
    return;
  }
  const uint64_t N = dataset_.token_count();
  cursor_ = static_cast<uint64_t>(
      (cursor_ + static_cast<unsigned __int128>(samples) * static_cast<uint64_t>(seq_len_)) % N);
}

std::vector<uint64_t> TokenWindowLoader::state_fields() const {
  if (!order_.shuffle) return {cursor_, dataset_.token_count()};
  return {cursor_, dataset_.token_count(), static_cast<uint64_t>(seq_len_), order_.seed};
}

void TokenWindowLoader::check_fields(std::span<const uint64_t> fields) const {
  const std::string& path = dataset_.path();
  const bool saved_shuffled = fields.size() == kShuffledFields;
  MOEPEAK_CHECK(saved_shuffled || fields.size() == kFileOrderFields, "a window-loader state of ",
                fields.size(), " fields");
  if (saved_shuffled != order_.shuffle) {
    MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint read ", path, " in ",
                        saved_shuffled ? "shuffled order" : "file order",
                        ", but this run has training.shuffle = ", order_.shuffle ? "true" : "false",
                        " (set it as the run started to resume it)");
  }
  if (fields[1] != dataset_.token_count()) {
    MOEPEAK_INPUT_ERROR("data-loader state: saved for a dataset of ", fields[1], " tokens, but ",
                        path, " has ", dataset_.token_count());
  }
  if (!saved_shuffled) {
    if (fields[0] >= dataset_.token_count()) {
      MOEPEAK_INPUT_ERROR("data-loader state: token offset ", fields[0], " is past the end of ",
                          path, " (", dataset_.token_count(), " tokens)");
    }
  } else {
    if (fields[2] != static_cast<uint64_t>(seq_len_)) {
      MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's shuffled windows of ", path, " are ",
                          fields[2], " tokens long, but this run has training.seq_len = ", seq_len_,
                          " (a shuffled order resumes only at the seq_len it began with)");
    }
    if (fields[3] != order_.seed) {
      MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's shuffled order of ", path,
                          " was drawn with job.seed = ", static_cast<int64_t>(fields[3]),
                          ", but this run has job.seed = ", static_cast<int64_t>(order_.seed));
    }
  }
}

void TokenWindowLoader::restore_fields(std::span<const uint64_t> fields) {
  check_fields(fields);
  cursor_ = fields[0];
}

std::vector<uint8_t> TokenWindowLoader::state() const {
  return encode_loader_state(dataset_.kind(), state_fields());
}

void TokenWindowLoader::restore(std::span<const uint8_t> state) {
  const size_t counts[] = {kFileOrderFields, kShuffledFields};
  restore_fields(decode_loader_state(state, dataset_.kind(), counts));
}

std::string TokenWindowLoader::describe_source() const {
  const std::string order =
      order_.shuffle
          ? detail::concat("shuffled each epoch (seed ", static_cast<int64_t>(order_.seed), ", ",
                           windows_per_epoch_, " windows per epoch)")
          : std::string("in file order");
  return detail::concat(dataset_.path(), ": ", dataset_.format(), ", ", dataset_.token_count(),
                        " tokens, ", order);
}

std::string TokenWindowLoader::describe() const {
  return detail::concat(describe_source(), "; ", batch_size_, " windows of ", seq_len_,
                        " + 1 tokens per batch, ", batch_size_ * seq_len_, " tokens per batch");
}

}  // namespace moepeak
