// TokenWindowLoader: training windows over a token dataset's stream (core/data/token_dataset.h),
// in a seeded shuffled order of the epoch (training.shuffle = true, the default for token files)
// or in file order (false).
//
// Both orders give each sample — row b of batch k is sample s = k*B + b of the run — the T + 1
// tokens of the stream from its start position p(s):
//   input_ids[b, t] = stream[p(s) + t],  labels[b, t] = stream[p(s) + t + 1]   (t = 0..T-1)
// so every position is scored and a window's last label is the next window's first input.
//
//   file order  p(s) = s*T mod N, read as a cycle: a window that runs past the end continues at
//               the start. The cursor is p of the next batch's first sample, which advances B*T
//               tokens per batch (llm.c's loader). State [token offset, N].
//   shuffled    the stream holds n = floor((N - 1) / T) whole windows, window j = stream
//               [j*T, j*T + T + 1); an epoch visits each once, in the order of the
//               WindowPermutation (core/data/window_permutation.h) of (job.seed, epoch):
//                 p(s) = T * permutation(n, seed, s / n)(s mod n)
//               so each epoch is reshuffled, and the < T tokens after the last whole window are
//               not seen (like Megatron's sample index). The cursor is s itself. State
//               [sample index, N, T, seed]: a resume checks that the order it continues is the
//               one the run started.
//
// A rank reads only its block of each batch (read_block): cols + 1 tokens of each of its rows,
// each id checked against the vocabulary as it is read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/data/data_loader.h"
#include "core/data/token_dataset.h"

namespace moepeak {

struct WindowOrder {
  bool shuffle = true;
  uint64_t seed = 0;  // draws the shuffled order (job.seed); unused in file order
};

class TokenWindowLoader final : public DataLoader {
 public:
  // Checks that the stream holds at least seq_len + 1 tokens (one window of inputs and labels);
  // the token ids are checked against vocab_size as windows are read (an id outside it:
  // moepeak::Error naming file, offset, byte and value).
  TokenWindowLoader(TokenDataset dataset, int64_t batch_size, int64_t seq_len, int64_t vocab_size,
                    WindowOrder order);

  int64_t batch_size() const override { return batch_size_; }
  int64_t seq_len() const override { return seq_len_; }
  const TokenDataset& dataset() const { return dataset_; }
  const WindowOrder& order() const { return order_; }
  // Shuffled: the whole windows of an epoch, n; file order: 0.
  uint64_t windows_per_epoch() const { return windows_per_epoch_; }
  // File order: the stream position of the next batch's first token; shuffled: the sample index
  // of the next batch's first row.
  uint64_t cursor() const { return cursor_; }

  // The window of the sample `ahead` samples after the cursor: its positions [col_begin,
  // col_begin + cols) as inputs and labels (cols + 1 tokens read). No cursor move.
  void read_window(uint64_t ahead, int64_t col_begin, int64_t cols, int64_t* input_ids,
                   int64_t* labels);
  // Moves the cursor `samples` samples on (advance() is skip(B)).
  void skip(uint64_t samples);

  // The document starts (DataLoader::read_document_starts) in the window of the sample `ahead`
  // samples after the cursor: appends each o in [1, T], ascending. The dataset must have a
  // document index (dataset().has_document_index(); moepeak::Error otherwise). No cursor move.
  void document_starts(uint64_t ahead, std::vector<int64_t>& starts) const;

  void read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) override;
  // Row `row` is the sample `row` after the cursor, as in read_block.
  void read_document_starts(int64_t row, std::vector<int64_t>& starts) override;
  void advance() override { skip(static_cast<uint64_t>(batch_size_)); }
  std::vector<uint8_t> state() const override;
  void restore(std::span<const uint8_t> state) override;
  std::string describe() const override;

  // The state's fields alone (state() encodes them), their check (moepeak::Error unless they
  // fit this dataset and order) and their check-and-apply (restore() decodes them); a blend keeps
  // one set per dataset.
  std::vector<uint64_t> state_fields() const;
  void check_fields(std::span<const uint64_t> fields) const;
  void restore_fields(std::span<const uint64_t> fields);
  // "PATH: FORMAT, N tokens, shuffled each epoch (...)" — describe() without the batch shape.
  std::string describe_source() const;

 private:
  uint64_t window_start(uint64_t ahead) const;  // p(s) of the sample `ahead` after the cursor
  TokenDataset dataset_;
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t vocab_size_;
  WindowOrder order_;
  uint64_t windows_per_epoch_ = 0;
  uint64_t cursor_ = 0;
  std::vector<int64_t> window_;  // cols + 1 tokens
};

}  // namespace moepeak
