// Each rank reads only its block of the global batch: rank_batch_block gives rank r its rows and
// columns (all W ranks' blocks tile the batch exactly once), and read_local_batch of that block
// from a loader equals those positions of the whole batch another loader reads — for the copy
// task and for a token file in both orders — with global positions. Run: ctest -R test_batch_shard
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <vector>

#include "core/data/batch_shard.h"
#include "core/data/copy_task.h"
#include "core/data/token_dataset.h"
#include "core/data/window_loader.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

struct Layout {
  int world, sp;  // sp 0 = W
};

TEST(BatchShard, BlocksTileTheBatchOnce) {
  const int64_t B = 4, T = 8;
  for (Layout l : {Layout{1, 0}, Layout{2, 0}, Layout{4, 0}, Layout{8, 0}, Layout{4, 2},
                   Layout{4, 1}, Layout{8, 2}}) {
    SCOPED_TRACE(testing::Message() << "W " << l.world << " Sp " << l.sp);
    std::vector<int> seen(B * T, 0);
    for (int r = 0; r < l.world; ++r) {
      const BatchBlock block = rank_batch_block(B, T, l.world, r, l.sp);
      ASSERT_EQ(block.tokens(), B * T / l.world);
      for (int64_t b = block.row_begin; b < block.row_begin + block.rows; ++b) {
        for (int64_t t = block.col_begin; t < block.col_begin + block.cols; ++t) ++seen[b * T + t];
      }
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(BatchShard, RejectsABatchThatDoesNotSplit) {
  EXPECT_CONTAINS(error_of([] { rank_batch_block(2, 10, 4, 0); }), "10 % 4 = 2");
  EXPECT_CONTAINS(error_of([] { rank_batch_block(3, 8, 4, 0, 2); }),
                  "training.batch_size = 3 cannot be split over 2 sequence groups");
  EXPECT_THROW(rank_batch_block(2, 10, 2, 2), Error);  // no rank 2 of 2
}

// The blocks every rank reads of `steps` batches equal the whole batches of a twin loader.
void expect_blocks_match_whole(DataLoader& per_rank, DataLoader& whole, const Layout& l,
                               int steps) {
  const int64_t B = whole.batch_size(), T = whole.seq_len();
  std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size());
  for (int step = 0; step < steps; ++step) {
    whole.next_batch(ids.data(), labels.data());
    int64_t scored = 0;
    for (int r = 0; r < l.world; ++r) {
      const BatchBlock block = rank_batch_block(B, T, l.world, r, l.sp);
      const LocalBatch local = read_local_batch(per_rank, block);
      ASSERT_EQ(local.batch, block.rows);
      ASSERT_EQ(local.local_seq_len, block.cols);
      for (int64_t n = 0; n < block.tokens(); ++n) {
        const int64_t b = block.row_begin + n / block.cols;
        const int64_t t = block.col_begin + n % block.cols;
        ASSERT_EQ(local.positions[n], t) << "a global position";
        ASSERT_EQ(local.input_ids[n], ids[b * T + t]) << "step " << step << " rank " << r;
        ASSERT_EQ(local.labels[n], labels[b * T + t]) << "step " << step << " rank " << r;
      }
      scored += count_scored(local.labels);
    }
    EXPECT_EQ(scored, count_scored(labels));
    per_rank.advance();
  }
}

TEST(BatchShard, CopyTaskBlocksEqualTheWholeBatch) {
  for (Layout l : {Layout{1, 0}, Layout{4, 0}, Layout{4, 2}, Layout{8, 2}}) {
    SCOPED_TRACE(testing::Message() << "W " << l.world << " Sp " << l.sp);
    CopyTaskLoader per_rank(4, 12, 50, 3), whole(4, 12, 50, 3);
    expect_blocks_match_whole(per_rank, whole, l, 3);
  }
}

TEST(BatchShard, TokenFileBlocksEqualTheWholeBatchInBothOrders) {
  test_support::TempDir dir("moepeak_test_batch_shard");
  const std::string path = (dir.path() / "tokens.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    for (uint16_t i = 0; i < 203; ++i) {  // 203 tokens: a window of 8 wraps in file order
      const uint16_t token = static_cast<uint16_t>((i * 37) % 251);
      out.write(reinterpret_cast<const char*>(&token), 2);
    }
  }
  for (bool shuffle : {false, true}) {
    for (Layout l : {Layout{1, 0}, Layout{4, 0}, Layout{4, 2}, Layout{8, 2}}) {
      SCOPED_TRACE(testing::Message()
                   << "shuffle " << shuffle << " W " << l.world << " Sp " << l.sp);
      const WindowOrder order{shuffle, 5};
      TokenWindowLoader per_rank(open_token_bin(path, TokenDtype::uint16), 4, 8, 251, order);
      TokenWindowLoader whole(open_token_bin(path, TokenDtype::uint16), 4, 8, 251, order);
      expect_blocks_match_whole(per_rank, whole, l, 9);  // 36 windows: past one epoch of 25
    }
  }
}

}  // namespace
}  // namespace moepeak
