// The synthetic long-range copy task: see core/data/copy_task.h for the exact sequence layout.
#include "core/data/copy_task.h"

#include <array>

#include "core/error.h"

namespace moepeak {

namespace {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64's increment

constexpr size_t kSampleFields = 2;      // [sample index, seed]
constexpr size_t kLegacyStepFields = 1;  // [micro-batch count]: before sequences had a sample index

// Hashes the counters one after another, each step a splitmix64 round, so that any change in
// any counter changes the result unpredictably.
uint64_t counter_hash(std::array<uint64_t, 3> counters) {
  uint64_t h = 0x6d6f657065616b31ULL;  // "moepeak1"
  for (uint64_t c : counters)
    h = splitmix64_mix(h + kGoldenGamma + splitmix64_mix(c + kGoldenGamma));
  return h;
}

}  // namespace

int64_t copy_task_random_token(int64_t seed, int64_t sample, int64_t index, int64_t vocab_size) {
  uint64_t bits = counter_hash(
      {static_cast<uint64_t>(seed), static_cast<uint64_t>(sample), static_cast<uint64_t>(index)});
  // Multiply-shift maps 64 random bits onto [0, V) (Lemire); the bias is below V / 2^64.
  unsigned __int128 scaled =
      static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(vocab_size);
  return static_cast<int64_t>(static_cast<uint64_t>(scaled >> 64));
}

CopyTaskLoader::CopyTaskLoader(int64_t batch_size, int64_t seq_len, int64_t vocab_size,
                               int64_t seed)
    : batch_size_(batch_size), seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed) {
  if (batch_size < 1)
    MOEPEAK_INPUT_ERROR("copy task: training.batch_size ", batch_size, " must be >= 1");
  if (seq_len < 2) {
    MOEPEAK_INPUT_ERROR("copy task: training.seq_len ", seq_len,
                        " must be >= 2 (a random half of seq_len / 2 tokens and its copy)");
  }
  if (vocab_size < 1)
    MOEPEAK_INPUT_ERROR("copy task: model.vocab_size ", vocab_size, " must be >= 1");
}

void CopyTaskLoader::read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) {
  check_block(block, batch_size_, seq_len_);
  const int64_t h = half();
  for (int64_t r = 0; r < block.rows; ++r) {
    const int64_t j = sample_ + block.row_begin + r;  // the run's sequence j
    int64_t* row_inputs = input_ids + r * block.cols;
    int64_t* row_labels = labels + r * block.cols;
    for (int64_t c = 0; c < block.cols; ++c) {
      const int64_t t = block.col_begin + c;
      row_inputs[c] = copy_task_random_token(seed_, j, t % h, vocab_size_);
      row_labels[c] =
          t + 1 >= h ? copy_task_random_token(seed_, j, (t + 1) % h, vocab_size_) : kIgnoreLabel;
    }
  }
}

std::vector<uint8_t> CopyTaskLoader::state() const {
  const uint64_t fields[] = {static_cast<uint64_t>(sample_), static_cast<uint64_t>(seed_)};
  return encode_loader_state(LoaderKind::copy, fields);
}

void CopyTaskLoader::restore(std::span<const uint8_t> state) {
  const size_t counts[] = {kLegacyStepFields, kSampleFields};
  const std::vector<uint64_t> fields = decode_loader_state(state, LoaderKind::copy, counts);
  if (fields.size() == kLegacyStepFields) {
    MOEPEAK_INPUT_ERROR(
        "data-loader state: a copy-task state of one field (", fields[0],
        " micro-batches read), saved by a moepeak that drew the copy task's sequences by "
        "(micro-batch, row); this build draws them by sample index, the same for any batch size "
        "and accumulation (docs/data.md#the-copy-task), so it cannot continue the sequences that "
        "run was reading: start the run again, or from its weights (moepeak export, then train "
        "--init-from)");
  }
  if (fields[0] > static_cast<uint64_t>(INT64_MAX)) {
    MOEPEAK_INPUT_ERROR("data-loader state: copy-task sample index ", fields[0],
                        " is out of range");
  }
  if (fields[1] != static_cast<uint64_t>(seed_)) {
    MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's copy task was drawn with job.seed = ",
                        static_cast<int64_t>(fields[1]), ", but this run has job.seed = ", seed_);
  }
  sample_ = static_cast<int64_t>(fields[0]);
}

std::string CopyTaskLoader::describe() const {
  return detail::concat("copy task: ", batch_size_, " x ", seq_len_, " tokens per batch, ", half(),
                        " random tokens then their copy, vocab ", vocab_size_, ", seed ", seed_);
}

}  // namespace moepeak
