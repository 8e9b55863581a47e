// BlendLoader: a blend of token datasets (training.datasets), sampled in proportion to their
// weights the way Megatron-LM's BlendedDataset assigns samples (megatron/core/datasets/helpers.cpp,
// build_blending_indices): with the weights normalised to w_d and c_d the samples drawn from
// dataset d so far, sample i of the run comes from
//
//   d(i) = the first d maximising  w_d * max(i, 1) - c_d
//
// and is that dataset's next sample (its own window order: shuffled or file order,
// core/data/window_loader.h). Greedy and deterministic, every prefix of the run stays close to
// the weights (each c_d within two samples of w_d * i; tests/data/test_blend.cpp), and the choice
// of sample i needs only the counts c_d — so the state is K counts and each dataset's cursor, no
// index table. A dataset of weight 0 is opened and checked but never sampled.
//
// Every rank computes the dataset of each row of the batch (B choices, no reading) and reads only
// its block's rows from their datasets.
//
// State (kind blend): [K, F, c_0 .. c_{K-1}, the K datasets' F cursor fields each, the K weights'
// float64 bits]; a resume refuses another number of datasets, another order, other datasets
// (their token counts) or other weights.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/data/data_loader.h"
#include "core/data/window_loader.h"

namespace moepeak {

class BlendLoader final : public DataLoader {
 public:
  // weights[d] >= 0, not all 0, one per loader (moepeak::Error otherwise); the loaders share B
  // and T.
  BlendLoader(std::vector<TokenWindowLoader> datasets, std::vector<double> weights);

  int64_t batch_size() const override { return datasets_.front().batch_size(); }
  int64_t seq_len() const override { return datasets_.front().seq_len(); }
  // Samples drawn from each dataset so far, c_d.
  const std::vector<uint64_t>& samples_drawn() const { return drawn_; }

  void read_block(const BatchBlock& block, int64_t* input_ids, int64_t* labels) override;
  // The row's dataset answers, for its own sample; one without a document index throws, naming
  // it (training.datasets[d] and its path).
  void read_document_starts(int64_t row, std::vector<int64_t>& starts) override;
  void advance() override;
  std::vector<uint8_t> state() const override;
  void restore(std::span<const uint8_t> state) override;
  std::string describe() const override;
  std::vector<SourceShare> shares() const override;

 private:
  struct Row {
    int dataset;
    uint64_t ahead;  // samples of that dataset before this one in the batch
  };
  std::vector<Row> plan_next_batch() const;
  std::vector<TokenWindowLoader> datasets_;
  std::vector<double> weights_;     // as given
  std::vector<double> normalised_;  // w_d, summing to 1
  std::vector<uint64_t> drawn_;     // c_d
};

}  // namespace moepeak
