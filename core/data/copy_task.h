// The built-in synthetic long-range copy task, the embedded default dataset
// (docs/design.md#conventions, docs/data.md#the-copy-task).
//
// Sequence j of the run — row b of the loader's k-th batch of B is j = k*B + b, as for token
// files (core/data/window_loader.h) — for sequence length T >= 2 and vocabulary V:
//
//   h          = floor(T / 2)                      the length of the random prefix
//   r[i]       = copy_task_random_token(seed, j, i, V), i = 0..h-1, uniform in [0, V)
//   tokens[i]  = r[i mod h],  i = 0..T             (the prefix, then the prefix again, ...)
//   input_ids[b, t] = tokens[t]                    t = 0..T-1
//   labels[b, t]    = tokens[t + 1]   if t + 1 >= h   (a copy of a token already in the input)
//                   = -100            if t + 1 <  h   (random, cannot be predicted)
//
// For even T = 2h the inputs are exactly the prefix twice and the last label is r[0] (the copy
// wraps around); for odd T = 2h + 1 the inputs are the prefix twice plus r[0] and the last label
// is r[1 mod h]. Either way T - h + 1 positions per sequence are scored, and each scored label
// equals the input token h positions earlier, so a model can reach zero loss only by attending
// back h positions.
//
// r comes from a counter-based generator (splitmix64 finalisers over seed, sample, index), so
// sequence j is the same whatever the batch size: a step of m micro-batches of B sequences
// (training.grad_accum_steps = m) reads sequences [k*m*B, (k+1)*m*B), those of one batch of m*B;
// it is the same whether it is reached by advancing or by restoring a state that says where, and
// any block of it is computed without the rest (each rank reads only its own).
//
// State (kind copy): [sample index of the next batch's first sequence, seed]; a resume refuses
// another job.seed. A one-field state [micro-batch count] is the layout from before sequences were
// indexed by sample (they were drawn by (micro-batch, row)): refused, saying so, since this build
// cannot continue the sequences that run was reading.
#pragma once

#include <cstdint>
#include <string>

#include "core/data/data_loader.h"

namespace moepeak {

// The i-th random token of the run's sequence `sample` (j above): uniform in [0, vocab_size).
int64_t copy_task_random_token(int64_t seed, int64_t sample, int64_t index, int64_t vocab_size);

class CopyTaskLoader final : public DataLoader {
 public:
  // Throws moepeak::Error when batch_size < 1, seq_len < 2 or vocab_size < 1.
  CopyTaskLoader(int64_t batch_size, int64_t seq_len, int64_t vocab_size, int64_t seed);

  int64_t batch_size() const override { return batch_size_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t half() const { return seq_len_ / 2; }  // h
  // The sample index of the next batch's first sequence (row b of it is sequence sample() + b).
  int64_t sample() const { return sample_; }

  void read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) override;
  void advance() override { sample_ += batch_size_; }
  std::vector<uint8_t> state() const override;
  void restore(std::span<const uint8_t> state) override;
  std::string describe() const override;

 private:
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t vocab_size_;
  int64_t seed_;
  int64_t sample_ = 0;
};

}  // namespace moepeak
