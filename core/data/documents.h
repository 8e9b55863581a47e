// Packed documents in a training window (training.document_mask, training.reset_position_ids;
// docs/data.md#packed-documents): where a window's documents start, and what that changes in a
// rank's share of the batch.
//
// A window of T inputs x[0..T) with labels y[t] = x[t + 1] holds documents back to back. The
// documents' starts are positions o in [1, T] (o = T: the token after the window, the window's
// last label, begins one; position 0 always begins the window's first, partial document):
//   boundaries = "eos"    o where x[o - 1] = model.eos_token_id (the EOS belongs to the document
//                         it ends; consecutive EOS are one-token documents)
//   boundaries = "index"  the loader's DataLoader::read_document_starts (a Megatron index)
// From the starts:
//   doc_start[t] = the largest start <= t (0 if none): query t sees keys doc_start[t] <= s <= t
//   positions[t] = t - doc_start[t] with reset_position_ids, else t
//   labels[t]    = -100 with document_mask where t + 1 is a start (the document's last token:
//                  its label is the next document's first token)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/config/config.h"

namespace moepeak {

struct DocumentOptions {
  bool mask = false;             // training.document_mask
  bool reset_positions = false;  // training.reset_position_ids
  DocumentBoundaries boundaries = DocumentBoundaries::eos;
  int64_t eos_token_id = -1;  // model.eos_token_id (boundaries = eos)

  bool enabled() const { return mask || reset_positions; }
  static DocumentOptions from(const TrainingConfig& training, const ModelConfig& model);
};

// Appends to `starts`, ascending, every o in [1, T] with ids[o - 1] == eos (T = ids.size()).
void eos_document_starts(std::span<const int64_t> ids, int64_t eos, std::vector<int64_t>& starts);

// doc_start (T) of a window from its ascending starts in [1, T] (starts outside are an error).
void document_start_of_positions(std::span<const int64_t> starts, int64_t T, int32_t* doc_start);

// Applies a window's documents to columns [col_begin, col_begin + cols) of it, given the
// window's doc_start (T) and starts: positions (cols) written (t - doc_start[t] or t), labels
// (cols) set to -100 at each document's last token when options.mask.
void apply_documents(const DocumentOptions& options, std::span<const int64_t> starts,
                     const int32_t* doc_start, int64_t col_begin, int64_t cols, int64_t* positions,
                     int64_t* labels);

}  // namespace moepeak
