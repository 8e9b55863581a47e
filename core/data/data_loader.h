// The training data interface: each step the trainer asks for the global batch of
// B = training.batch_size sequences of T = training.seq_len tokens — or for the block of it that
// one rank holds, which is all that rank reads —
//
//   auto loader = make_data_loader(cfg.training, cfg.model, cfg.job.seed);
//   loader->read_block(block, input_ids, labels);  // this rank's rows x columns of the batch
//   loader->advance();                             // on to the next batch (every rank)
//   loader->next_batch(input_ids, labels);         // or the whole (B, T) batch, then advance
//   std::vector<uint8_t> saved = loader->state();  // into the checkpoint
//   ...
//   loader->restore(saved);                  // a resumed run reads the batches an
//                                            // uninterrupted one would have read
//
// labels[b, t] is the token that should follow input_ids[b, t], or kIgnoreLabel (-100) where the
// position is not scored. Batches depend only on the seed, the dataset and the loader's cursor,
// never on wall-clock time, thread timing or which block of them a rank reads. Every source
// numbers the run's sequences: row b of the k-th batch is sample j = k*B + b, and what sample j
// holds does not depend on B, so the m micro-batches of B that a step of
// training.grad_accum_steps = m reads are the one batch of m*B.
//
// Three sources (docs/design.md#conventions), chosen by training.dataset, and blends of token
// files (training.datasets, core/data/blend_loader.h):
//   copy      the built-in synthetic long-range copy task (core/data/copy_task.h)
//   bin       an llm.c / nanoGPT token file, stored as training.token_dtype
//             (core/data/token_dataset.h)
//   megatron  a Megatron-LM .bin/.idx indexed dataset; its .idx names the token type, so
//             training.token_dtype is not used (core/data/token_dataset.h)
// Token files are windowed by core/data/window_loader.h: in a seeded shuffled order of the
// epoch's windows (training.shuffle, the default) or in file order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace moepeak {

// The label of a position that does not count towards the loss (PyTorch's ignore_index).
inline constexpr int64_t kIgnoreLabel = -100;

// A rectangle of a (B, T) batch: sequences [row_begin, row_begin + rows), positions
// [col_begin, col_begin + cols) of each.
struct BatchBlock {
  int64_t row_begin = 0, rows = 0, col_begin = 0, cols = 0;
  int64_t tokens() const { return rows * cols; }
  bool operator==(const BatchBlock&) const = default;
};

// Throws moepeak::Error unless `block` is non-empty and lies inside a (batch, seq_len) batch.
void check_block(const BatchBlock& block, int64_t batch, int64_t seq_len);

// One dataset's part in the samples a loader has given so far (a blend's members), for the
// metrics.
struct SourceShare {
  std::string path;
  double weight = 0;     // as configured
  uint64_t samples = 0;  // sequences drawn from it
};

class DataLoader {
 public:
  virtual ~DataLoader() = default;

  virtual int64_t batch_size() const = 0;  // B
  virtual int64_t seq_len() const = 0;     // T

  // Fills `block` of the next batch: input_ids and labels each hold block.tokens() values,
  // row-major (rows, cols), equal to those positions of the whole batch. Reads only what the
  // block needs (a token file: cols + 1 tokens per row). Does not move the cursor. Throws
  // moepeak::Error on a block outside (B, T) and on bad data it reads (a token file: an id
  // outside the vocabulary, naming file and offset); the outputs are then partly written.
  virtual void read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) = 0;
  // training.document_boundaries = "index": where documents start in row `row` of the next batch,
  // from the dataset's own document index. Appends to `starts`, ascending, every o in [1, T] at
  // which a document starts in the row's window (o = T: the token after the window, the window's
  // last label, begins one); the window's own start (o = 0) is never listed. Does not move the
  // cursor. Throws moepeak::Error naming the dataset unless it has a document index (a Megatron
  // dataset; a blend asks the row's dataset).
  virtual void read_document_starts(int64_t row, std::vector<int64_t>& starts);
  // Moves the cursor to the next batch.
  virtual void advance() = 0;

  // The whole batch: read_block of (B, T), then advance(). B*T values each, row-major (B, T).
  void next_batch(int64_t* input_ids, int64_t* labels);
  BatchBlock whole_batch() const { return BatchBlock{0, batch_size(), 0, seq_len()}; }

  // The cursor as a small self-describing byte string (see encode_loader_state); restore() of
  // that string on a loader opened with the same settings continues with the same batches.
  // restore() throws moepeak::Error on a state of another kind of loader, of the wrong size, or
  // one that does not fit this dataset; the loader is unchanged then.
  virtual std::vector<uint8_t> state() const = 0;
  virtual void restore(std::span<const uint8_t> state) = 0;

  // One line for the log: the source, its size and the batch shape.
  virtual std::string describe() const = 0;

  // A blend's datasets and the samples each has given; empty for a single source.
  virtual std::vector<SourceShare> shares() const { return {}; }
};

// read_document_starts' error for a source with no document index; `source` names it (its
// describe(), or a blend's member).
[[noreturn]] void throw_no_document_index(const std::string& source);

// Opens the dataset that `training` names (training.dataset, dataset_path, token_dtype,
// shuffle) for batches of training.batch_size x training.seq_len, checking every token id
// against model.vocab_size as its window is read (nothing O(dataset) at open). `seed` draws the
// copy task's tokens and a token file's shuffled order. Throws moepeak::Error naming the file and
// position of anything wrong.
std::unique_ptr<DataLoader> make_data_loader(const TrainingConfig& training,
                                             const ModelConfig& model, int64_t seed);

// The held-out loader of eval.dataset_path (Trainer::evaluate): training.dataset's format and
// training.token_dtype, in file order, batches of training.batch_size x training.seq_len. Throws
// moepeak::Error naming the file when it cannot be opened, stores another token type than the
// training data (another tokenizer's ids), or holds fewer than eval.batches x batch_size x
// seq_len + 1 tokens (an evaluation would read a window twice).
std::unique_ptr<DataLoader> make_eval_loader(const EvalConfig& eval, const TrainingConfig& training,
                                             const ModelConfig& model);

// ---- The state byte string --------------------------------------------------------------------
// Layout (little-endian): "MPDL" (4 bytes), format version (1 byte, = 1), loader kind (1 byte,
// the LoaderKind value), field count n (2 bytes), then n uint64 fields. The fields per kind:
//   copy:      [sample index, seed] (core/data/copy_task.h; a one-field [step] state, from
//              before the copy task was indexed by sample, is refused naming why)
//   bin, megatron in file order:  [token offset, token count of the dataset]
//   bin, megatron shuffled:       [sample index, token count of the dataset, seq_len, seed]
//   blend:                        core/data/blend_loader.h

enum class LoaderKind : uint8_t { copy = 0, bin = 1, megatron = 2, blend = 3 };

std::string_view loader_kind_name(LoaderKind kind);

std::vector<uint8_t> encode_loader_state(LoaderKind kind, std::span<const uint64_t> fields);

// The fields of `state`; throws moepeak::Error unless it is a well-formed state of `kind` with
// exactly `field_count` fields.
std::vector<uint64_t> decode_loader_state(std::span<const uint8_t> state, LoaderKind kind,
                                          size_t field_count);
// The same for a kind whose states come in several lengths: any field count in `field_counts`
// (empty: any count, for a state that says its own length).
std::vector<uint64_t> decode_loader_state(std::span<const uint8_t> state, LoaderKind kind,
                                          std::span<const size_t> field_counts);

}  // namespace moepeak
