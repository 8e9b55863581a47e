// Packed documents in a window: see documents.h.
#include "core/data/documents.h"

#include <algorithm>

#include "core/data/data_loader.h"
#include "core/error.h"

namespace moepeak {

DocumentOptions DocumentOptions::from(const TrainingConfig& training, const ModelConfig& model) {
  DocumentOptions o;
  o.mask = training.document_mask;
  o.reset_positions = training.reset_position_ids;
  o.boundaries = training.document_boundaries;
  o.eos_token_id = model.eos_token_id;
  return o;
}

void eos_document_starts(std::span<const int64_t> ids, int64_t eos, std::vector<int64_t>& starts) {
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] == eos) starts.push_back(static_cast<int64_t>(t) + 1);
  }
}

void document_start_of_positions(std::span<const int64_t> starts, int64_t T, int32_t* doc_start) {
  int64_t previous = 0;
  for (int64_t o : starts) {
    MOEPEAK_CHECK(o > previous && o <= T, "document start ", o, " after ", previous,
                  " in a window of ", T, " (ascending, in [1, T])");
    previous = o;
  }
  int64_t current = 0;
  size_t next = 0;
  for (int64_t t = 0; t < T; ++t) {
    while (next < starts.size() && starts[next] <= t) current = starts[next++];
    doc_start[t] = static_cast<int32_t>(current);
  }
}

void apply_documents(const DocumentOptions& options, std::span<const int64_t> starts,
                     const int32_t* doc_start, int64_t col_begin, int64_t cols, int64_t* positions,
                     int64_t* labels) {
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t t = col_begin + c;
    positions[c] = options.reset_positions ? t - doc_start[t] : t;
  }
  if (!options.mask) return;
  // The starts in (col_begin, col_begin + cols]: their previous positions are documents' last.
  auto it = std::upper_bound(starts.begin(), starts.end(), col_begin);
  for (; it != starts.end() && *it <= col_begin + cols; ++it)
    labels[*it - 1 - col_begin] = kIgnoreLabel;
}

}  // namespace moepeak
