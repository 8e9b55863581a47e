// BlendLoader: see blend_loader.h for the sampling rule and the state.
#include "core/data/blend_loader.h"

#include <bit>
#include <cmath>

#include "core/error.h"

namespace moepeak {

BlendLoader::BlendLoader(std::vector<TokenWindowLoader> datasets, std::vector<double> weights)
    : datasets_(std::move(datasets)), weights_(std::move(weights)) {
  MOEPEAK_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(), "a blend of ",
                datasets_.size(), " datasets with ", weights_.size(), " weights");
  double total = 0;
  for (size_t d = 0; d < weights_.size(); ++d) {
    if (!std::isfinite(weights_[d]) || weights_[d] < 0) {
      MOEPEAK_INPUT_ERROR("training.datasets[", d, "] (", datasets_[d].dataset().path(),
                          "): weight must be a finite number >= 0, got ", weights_[d]);
    }
    MOEPEAK_CHECK(datasets_[d].batch_size() == batch_size() && datasets_[d].seq_len() == seq_len(),
                  "a blend's datasets differ in batch shape");
    total += weights_[d];
  }
  if (total <= 0) {
    MOEPEAK_INPUT_ERROR("training.datasets: every weight is 0, so the blend has nothing to sample");
  }
  for (double w : weights_) normalised_.push_back(w / total);
  drawn_.assign(datasets_.size(), 0);
}

std::vector<BlendLoader::Row> BlendLoader::plan_next_batch() const {
  std::vector<uint64_t> count = drawn_;
  uint64_t sample = 0;
  for (uint64_t c : count) sample += c;
  std::vector<Row> rows;
  rows.reserve(static_cast<size_t>(batch_size()));
  for (int64_t b = 0; b < batch_size(); ++b, ++sample) {
    // NOTES: Megatron's rule, including its max(i, 1) and the first index on a tie; a weight of
    // 0 is skipped rather than compared, since its error -c_d = 0 could tie with the others'.
    const double at = std::max(static_cast<double>(sample), 1.0);
    int best = -1;
    double best_error = 0;
    for (size_t d = 0; d < datasets_.size(); ++d) {
      if (normalised_[d] == 0) continue;
      const double error = normalised_[d] * at - static_cast<double>(count[d]);
      if (best < 0 || error > best_error) {
        best = static_cast<int>(d);
        best_error = error;
      }
    }
    rows.push_back({best, count[static_cast<size_t>(best)] - drawn_[static_cast<size_t>(best)]});
    ++count[static_cast<size_t>(best)];
  }
  return rows;
}

void BlendLoader::read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) {
  check_block(block, batch_size(), seq_len());
  const std::vector<Row> rows = plan_next_batch();
  for (int64_t r = 0; r < block.rows; ++r) {
    const Row& row = rows[static_cast<size_t>(block.row_begin + r)];
    datasets_[static_cast<size_t>(row.dataset)].read_window(row.ahead, block.col_begin, block.cols,
                                                            input_ids + r * block.cols,
                                                            labels + r * block.cols);
  }
}

void BlendLoader::read_document_starts(int64_t row, std::vector<int64_t>& starts) {
  MOEPEAK_CHECK(row >= 0 && row < batch_size(), "row ", row, " of a batch of ", batch_size());
  const Row chosen = plan_next_batch()[static_cast<size_t>(row)];
  const TokenWindowLoader& dataset = datasets_[static_cast<size_t>(chosen.dataset)];
  if (!dataset.dataset().has_document_index()) {
    throw_no_document_index(detail::concat("training.datasets[", chosen.dataset, "] (",
                                           dataset.describe_source(), ")"));
  }
  dataset.document_starts(chosen.ahead, starts);
}

void BlendLoader::advance() {
  std::vector<uint64_t> taken(datasets_.size(), 0);
  for (const Row& row : plan_next_batch()) ++taken[static_cast<size_t>(row.dataset)];
  for (size_t d = 0; d < datasets_.size(); ++d) {
    datasets_[d].skip(taken[d]);
    drawn_[d] += taken[d];
  }
}

std::vector<uint8_t> BlendLoader::state() const {
  const size_t K = datasets_.size();
  const std::vector<uint64_t> first = datasets_.front().state_fields();
  std::vector<uint64_t> fields = {K, first.size()};
  fields.insert(fields.end(), drawn_.begin(), drawn_.end());
  for (const TokenWindowLoader& d : datasets_) {
    const std::vector<uint64_t> own = d.state_fields();
    fields.insert(fields.end(), own.begin(), own.end());
  }
  for (double w : weights_) fields.push_back(std::bit_cast<uint64_t>(w));
  return encode_loader_state(LoaderKind::blend, fields);
}

void BlendLoader::restore(std::span<const uint8_t> state) {
  const size_t K = datasets_.size();
  const size_t F = datasets_.front().state_fields().size();
  // The state says its own K and F (its first two fields): any length is decoded, then checked.
  const std::vector<uint64_t> fields =
      decode_loader_state(state, LoaderKind::blend, std::span<const size_t>());
  if (fields.size() < 2) {
    MOEPEAK_INPUT_ERROR("data-loader state: a damaged blend state (", fields.size(), " fields)");
  }
  if (fields[0] != K) {
    MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's blend has ", fields[0],
                        " datasets, this run's training.datasets has ", K);
  }
  if (fields.size() != 2 + K * (2 + fields[1])) {
    MOEPEAK_INPUT_ERROR("data-loader state: a damaged blend state (", fields.size(), " fields for ",
                        K, " datasets of ", fields[1], " fields)");
  }
  if (fields[1] != F) {
    MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's blend read its datasets in ",
                        fields[1] == 4 ? "shuffled order" : "file order",
                        ", but this run has training.shuffle = ", F == 4 ? "true" : "false");
  }
  for (size_t d = 0; d < K; ++d) {
    const double saved = std::bit_cast<double>(fields[2 + K + K * F + d]);
    if (saved != weights_[d]) {
      MOEPEAK_INPUT_ERROR("data-loader state: the checkpoint's blend gave ",
                          datasets_[d].dataset().path(), " (training.datasets[", d, "]) weight ",
                          saved, ", this run gives it ", weights_[d],
                          " (a blend resumes only with the weights it began with)");
    }
  }
  // Every dataset's cursor is checked before any is set, so that a refused state changes nothing.
  auto cursor_fields = [&](size_t d) {
    return std::span<const uint64_t>(fields).subspan(2 + K + d * F, F);
  };
  for (size_t d = 0; d < K; ++d) datasets_[d].check_fields(cursor_fields(d));
  for (size_t d = 0; d < K; ++d) {
    datasets_[d].restore_fields(cursor_fields(d));
    drawn_[d] = fields[2 + d];
  }
}

std::string BlendLoader::describe() const {
  std::string out = detail::concat("a blend of ", datasets_.size(), " datasets, ", batch_size(),
                                   " windows of ", seq_len(), " + 1 tokens per batch: ");
  for (size_t d = 0; d < datasets_.size(); ++d) {
    out += detail::concat(d ? "; " : "", "weight ", weights_[d], " (",
                          std::round(normalised_[d] * 1000) / 10, "%) ",
                          datasets_[d].describe_source());
  }
  return out;
}

std::vector<SourceShare> BlendLoader::shares() const {
  std::vector<SourceShare> out;
  for (size_t d = 0; d < datasets_.size(); ++d)
    out.push_back({datasets_[d].dataset().path(), weights_[d], drawn_[d]});
  return out;
}

}  // namespace moepeak
