// This rank's share of the global batch under sequence parallelism (docs/parallelism.md): with
// Sp ranks per sequence group, rank r of W is rank r % Sp of sequence group g = r / Sp, which
// holds sequences [g*B/(W/Sp), (g+1)*B/(W/Sp)); the rank takes positions [(r%Sp)*T/Sp, +T/Sp) of
// each — N = B*T/W distinct tokens — with their global positions (RoPE needs the true position
// in the sequence). Sp = W (the default): every rank takes its slice of all B sequences.
//
//   global input_ids, labels: (B, T) row-major
//   local  input_ids, labels, positions: (B/(W/Sp), T/Sp) row-major = (N) tokens, sequence-major
//
// The rank reads only that block from the loader (DataLoader::read_block): no rank reads the
// global batch. With packed documents (core/data/documents.h) the rank needs each of its
// sequences' boundaries over the whole T — its own positions' documents start before its slice,
// and after the Ulysses all-to-all its attention holds whole sequences — so it reads the whole
// rows of its sequence group (boundaries = "eos": Sp x the tokens, no communication) or asks the
// loader for the rows' starts ("index").
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/data_loader.h"
#include "core/data/documents.h"

namespace moepeak {

struct LocalBatch {
  std::vector<int64_t> input_ids, labels, positions;  // N = B * T / W each
  int64_t batch = 0, local_seq_len = 0;               // B/(W/Sp) sequences of T/Sp tokens
  // With training.document_mask: (B/(W/Sp), T) the first position of each position's document
  // in each whole sequence of the group (the attention's AttentionVariant::doc_start); else empty.
  std::vector<int32_t> doc_start;
};

// The block of a (batch, seq_len) batch that `rank` of `world` holds. Throws moepeak::Error
// unless 0 <= rank < world, Sp divides W, seq_len % Sp == 0 and batch % (W/Sp) == 0 (naming the
// numbers). sequence_parallel 0 = W.
BatchBlock rank_batch_block(int64_t batch, int64_t seq_len, int world, int rank,
                            int sequence_parallel = 0);

// The block's tokens of the loader's next batch, with their global positions — or, with
// `documents` enabled, positions, labels and doc_start as documents.h defines them. Does not
// advance the loader.
LocalBatch read_local_batch(DataLoader& loader, const BatchBlock& block,
                            const DocumentOptions& documents = {});

// Labels that count towards the loss (not -100) in `labels`.
int64_t count_scored(const std::vector<int64_t>& labels);

}  // namespace moepeak
