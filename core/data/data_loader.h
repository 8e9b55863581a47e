// The training data interface: each step the trainer asks for the global batch of
// B = training.batch_size sequences of T = training.seq_len tokens,
//
//   auto loader = make_data_loader(cfg.training, cfg.model, cfg.job.seed);
//   loader->next_batch(input_ids, labels);   // each B*T int64, row-major (B, T)
//   std::vector<uint8_t> saved = loader->state();   // into the checkpoint
//   ...
//   loader->restore(saved);                  // a resumed run reads the batches an
//                                            // uninterrupted one would have read
//
// labels[b, t] is the token that should follow input_ids[b, t], or kIgnoreLabel (-100) where the
// position is not scored. Batches depend only on the seed, the dataset and the loader's cursor,
// never on wall-clock time or thread timing.
//
// Three sources (docs/design.md#conventions), chosen by training.dataset:
//   copy      the built-in synthetic long-range copy task (core/data/copy_task.h)
//   bin       an llm.c / nanoGPT token file, stored as training.token_dtype
//             (core/data/token_dataset.h)
//   megatron  a Megatron-LM .bin/.idx indexed dataset; its .idx names the token type, so
//             training.token_dtype is not used (core/data/token_dataset.h)
// The seed matters only to the copy task; token files are read in order.
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

class DataLoader {
 public:
  virtual ~DataLoader() = default;

  virtual int64_t batch_size() const = 0;  // B
  virtual int64_t seq_len() const = 0;     // T

  // Fills the next global batch: input_ids and labels each hold B*T values, row-major (B, T).
  // Advances the cursor by one step.
  virtual void next_batch(int64_t* input_ids, int64_t* labels) = 0;

  // The cursor as a small self-describing byte string (see encode_loader_state); restore() of
  // that string on a loader opened with the same settings continues with the same batches.
  // restore() throws moepeak::Error on a state of another kind of loader, of the wrong size, or
  // one that does not fit this dataset; the loader is unchanged then.
  virtual std::vector<uint8_t> state() const = 0;
  virtual void restore(std::span<const uint8_t> state) = 0;

  // One line for the log: the source, its size and the batch shape.
  virtual std::string describe() const = 0;
};

// Opens the dataset that `training` names (training.dataset, dataset_path, token_dtype) for
// batches of training.batch_size x training.seq_len, checking every token id against
// model.vocab_size as its window is read (nothing O(dataset) at open). Throws moepeak::Error naming
// the file and position of anything wrong.
std::unique_ptr<DataLoader> make_data_loader(const TrainingConfig& training,
                                             const ModelConfig& model, int64_t seed);

// ---- The state byte string --------------------------------------------------------------------
// Layout (little-endian): "MPDL" (4 bytes), format version (1 byte, = 1), loader kind (1 byte,
// the LoaderKind value), field count n (2 bytes), then n uint64 fields. The fields per kind:
//   copy:      [step]
//   bin:       [token offset, token count of the dataset]
//   megatron:  [token offset, token count of the dataset]

enum class LoaderKind : uint8_t { copy = 0, bin = 1, megatron = 2 };

std::string_view loader_kind_name(LoaderKind kind);

std::vector<uint8_t> encode_loader_state(LoaderKind kind, std::span<const uint64_t> fields);

// The fields of `state`; throws moepeak::Error unless it is a well-formed state of `kind` with
// exactly `field_count` fields.
std::vector<uint64_t> decode_loader_state(std::span<const uint8_t> state, LoaderKind kind,
                                          size_t field_count);

}  // namespace moepeak
