// The shuffled order of a token file's windows (training.shuffle = true, core/data/
// window_loader.h): an epoch visits every whole window [j*T, j*T + T + 1) exactly once, the next
// epoch in another order; the order is fixed by job.seed; shuffle is the default for token files
// and false keeps file order; a restored state continues with the exact batches (across an epoch
// boundary too), and a state of the other order, another seq_len or another seed is refused with
// an error that says which. Run: ctest -R test_shuffled_windows
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/data_loader.h"
#include "core/data/window_loader.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

class ShuffledWindows : public ::testing::Test {
 protected:
  // A headerless uint16 file of tokens 0, 1, ..., n-1: a token's value is its stream position.
  std::string write_iota(const std::string& name, int n) {
    const std::string p = (temp_.path() / name).string();
    std::ofstream out(p, std::ios::binary);
    for (int i = 0; i < n; ++i) {
      const auto token = static_cast<uint16_t>(i);
      out.write(reinterpret_cast<const char*>(&token), 2);
    }
    return p;
  }
  TrainingConfig training(const std::string& path, int64_t B, int64_t T, bool shuffle) const {
    TrainingConfig t;
    t.dataset = DatasetKind::bin;
    t.dataset_path = path;
    t.token_dtype = TokenDtype::uint16;
    t.batch_size = B;
    t.seq_len = T;
    t.shuffle = shuffle;
    return t;
  }
  static ModelConfig model() {
    ModelConfig m;
    m.vocab_size = 1000;
    return m;
  }
  // The window starts of `batches` batches, checking each row is T + 1 consecutive tokens.
  static std::vector<int64_t> starts(DataLoader& loader, int batches) {
    const int64_t B = loader.batch_size(), T = loader.seq_len();
    std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size()), out;
    for (int i = 0; i < batches; ++i) {
      loader.next_batch(ids.data(), labels.data());
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) {
          EXPECT_EQ(ids[b * T + t], ids[b * T] + t) << "a window is consecutive tokens";
          EXPECT_EQ(labels[b * T + t], ids[b * T] + t + 1) << "labels are the next tokens";
        }
        out.push_back(ids[b * T]);
      }
    }
    return out;
  }
  test_support::TempDir temp_{"moepeak_test_shuffled"};
};

TEST_F(ShuffledWindows, EachEpochVisitsEveryWholeWindowOnceInANewOrder) {
  // 203 tokens, T = 8: floor(202 / 8) = 25 whole windows; the last 2 tokens are never an input.
  const std::string p = write_iota("train.bin", 203);
  auto loader = make_data_loader(training(p, 5, 8, true), model(), 42);
  const std::vector<int64_t> s = starts(*loader, 15);  // 75 samples: three epochs of 25
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(s.begin() + 25 * e, s.begin() + 25 * (e + 1));
    std::set<int64_t> windows(epoch.begin(), epoch.end());
    ASSERT_EQ(windows.size(), 25u) << "epoch " << e << " repeats a window";
    for (int64_t start : windows) {
      EXPECT_EQ(start % 8, 0) << "whole windows only";
      EXPECT_LE(start + 8, 202) << "the window's last label is inside the file";
    }
    epochs.push_back(epoch);
  }
  EXPECT_NE(epochs[0], epochs[1]) << "reshuffled each epoch";
  EXPECT_NE(epochs[1], epochs[2]);
  std::vector<int64_t> file_order;
  for (int j = 0; j < 25; ++j) file_order.push_back(8 * j);
  EXPECT_NE(epochs[0], file_order) << "shuffled, not in file order";
  EXPECT_CONTAINS(loader->describe(), "shuffled each epoch (seed 42, 25 windows per epoch)");
}

TEST_F(ShuffledWindows, TheOrderIsTheSeeds) {
  const std::string p = write_iota("train.bin", 401);
  auto a = make_data_loader(training(p, 4, 8, true), model(), 1);
  auto b = make_data_loader(training(p, 4, 8, true), model(), 1);
  auto c = make_data_loader(training(p, 4, 8, true), model(), 2);
  const std::vector<int64_t> sa = starts(*a, 10), sb = starts(*b, 10), sc = starts(*c, 10);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST_F(ShuffledWindows, ShuffleIsTheDefaultForTokenFilesAndFalseKeepsFileOrder) {
  const std::string p = write_iota("train.bin", 100);
  TrainingConfig defaults;
  defaults.dataset = DatasetKind::bin;
  defaults.dataset_path = p;
  defaults.batch_size = 2;
  defaults.seq_len = 8;
  EXPECT_TRUE(defaults.shuffle);
  EXPECT_CONTAINS(make_data_loader(defaults, model(), 0)->describe(), "shuffled each epoch");
  auto in_order = make_data_loader(training(p, 2, 8, false), model(), 0);
  EXPECT_CONTAINS(in_order->describe(), "in file order");
  EXPECT_EQ(starts(*in_order, 3), (std::vector<int64_t>{0, 8, 16, 24, 32, 40}));
}

TEST_F(ShuffledWindows, RestoreContinuesWithTheSameBatchesAcrossAnEpoch) {
  const std::string p = write_iota("train.bin", 203);  // 25 windows per epoch
  const TrainingConfig t = training(p, 3, 8, true);
  for (int before : {0, 4, 8, 9}) {  // batch 8 holds samples 24..26: the first epoch's end
    SCOPED_TRACE(testing::Message() << "restored after " << before << " batches");
    auto run = make_data_loader(t, model(), 9);
    starts(*run, before);
    const std::vector<uint8_t> saved = run->state();
    const std::vector<int64_t> expected = starts(*run, 6);
    auto resumed = make_data_loader(t, model(), 9);
    resumed->restore(saved);
    EXPECT_EQ(starts(*resumed, 6), expected);
    // "MPDL" v1, kind bin, 4 fields: sample index 3 * before, N, T, seed.
    ASSERT_EQ(saved.size(), 8u + 4 * 8);
    EXPECT_EQ(saved[7] * 256 + saved[6], 4);
    EXPECT_EQ(saved[8], 3 * before);
    EXPECT_EQ(saved[16], 203);
    EXPECT_EQ(saved[24], 8);
    EXPECT_EQ(saved[32], 9);
  }
}

TEST_F(ShuffledWindows, RestoreRefusesAnotherOrderSeqLenOrSeed) {
  const std::string p = write_iota("train.bin", 203);
  auto shuffled = make_data_loader(training(p, 2, 8, true), model(), 9);
  auto in_order = make_data_loader(training(p, 2, 8, false), model(), 9);
  starts(*shuffled, 2);
  starts(*in_order, 2);
  EXPECT_CONTAINS(
      error_of([&] { in_order->restore(shuffled->state()); }),
      "the checkpoint read " + p + " in shuffled order, but this run has training.shuffle = false");
  EXPECT_CONTAINS(error_of([&] { shuffled->restore(in_order->state()); }),
                  "in file order, but this run has training.shuffle = true");
  auto longer = make_data_loader(training(p, 2, 10, true), model(), 9);
  EXPECT_CONTAINS(error_of([&] { longer->restore(shuffled->state()); }),
                  "are 8 tokens long, but this run has training.seq_len = 10");
  auto reseeded = make_data_loader(training(p, 2, 8, true), model(), 10);
  EXPECT_CONTAINS(error_of([&] { reseeded->restore(shuffled->state()); }),
                  "was drawn with job.seed = 9, but this run has job.seed = 10");
  const std::vector<uint8_t> before = reseeded->state();
  EXPECT_THROW(reseeded->restore(shuffled->state()), Error);
  EXPECT_EQ(reseeded->state(), before) << "a refused state leaves the loader as it was";
}

}  // namespace
}  // namespace moepeak
