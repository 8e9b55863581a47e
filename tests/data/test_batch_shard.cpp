// shard_batch: each rank's contiguous slice of every sequence with global positions; the slices
// of all ranks tile the global batch exactly once. Run: ctest -R test_batch_shard
#include <gtest/gtest.h>

#include "core/data/batch_shard.h"
#include "core/error.h"

namespace moepeak {
namespace {

TEST(BatchShard, SlicesTileTheGlobalBatchWithGlobalPositions) {
  const int64_t B = 3, T = 8;
  std::vector<int64_t> ids(B * T), labels(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = 1000 + i;
    labels[i] = i % 5 == 0 ? -100 : 2000 + i;
  }
  for (int W : {1, 2, 4, 8}) {
    std::vector<int> seen(B * T, 0);
    int64_t scored = 0;
    for (int r = 0; r < W; ++r) {
      LocalBatch local = shard_batch(ids, labels, B, T, W, r);
      ASSERT_EQ(local.local_seq_len, T / W);
      ASSERT_EQ(local.input_ids.size(), static_cast<size_t>(B * T / W));
      for (size_t n = 0; n < local.input_ids.size(); ++n) {
        const int64_t b = static_cast<int64_t>(n) / (T / W);
        const int64_t t = local.positions[n];
        EXPECT_EQ(t, r * (T / W) + static_cast<int64_t>(n) % (T / W)) << "global position";
        EXPECT_EQ(local.input_ids[n], ids[b * T + t]);
        EXPECT_EQ(local.labels[n], labels[b * T + t]);
        ++seen[b * T + t];
      }
      scored += count_scored(local.labels);
    }
    for (int s : seen) EXPECT_EQ(s, 1) << "W = " << W;
    EXPECT_EQ(scored, count_scored(labels));
  }
}

TEST(BatchShard, RejectsASequenceThatDoesNotSplit) {
  std::vector<int64_t> ids(2 * 10), labels(2 * 10);
  try {
    shard_batch(ids, labels, 2, 10, 4, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 % 4 = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shard_batch(ids, labels, 2, 10, 2, 2), Error);
  EXPECT_THROW(shard_batch(ids, labels, 3, 10, 2, 0), Error);  // sizes do not match
}

}  // namespace
}  // namespace moepeak
