// This rank's share of the global batch under sequence parallelism
// (docs/design.md#parallel-layout): rank r of W takes positions [r*T/W, (r+1)*T/W) of every one of
// the B sequences — N = B*T/W distinct tokens — with their global positions (RoPE needs the true
// position in the sequence).
//
//   global input_ids, labels: (B, T) row-major
//   local  input_ids, labels, positions: (B, T/W) row-major = (N) tokens, sequence-major
#pragma once

#include <cstdint>
#include <vector>

namespace moepeak {

struct LocalBatch {
  std::vector<int64_t> input_ids, labels, positions;  // N = B * T / W each
  int64_t batch = 0, local_seq_len = 0;
};

// Throws moepeak::Error unless 0 <= rank < world and seq_len % world == 0 (naming the numbers).
LocalBatch shard_batch(const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                       int64_t batch, int64_t seq_len, int world, int rank);

// Labels that count towards the loss (not -100) in `labels`.
int64_t count_scored(const std::vector<int64_t>& labels);

}  // namespace moepeak
