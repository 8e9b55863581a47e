// Packed documents in the data layer (core/data/documents.h, read_local_batch with
// DocumentOptions): where a window's documents start, the doc_start each position gets, the
// positions that restart and the labels that are not scored — by hand on the edge cases (an EOS at
// 0, consecutive EOS, an EOS at T - 1 and as the token after the window, no EOS at all) — and
// every rank's block of a token file's batch, under sequence parallelism, against the same
// computed over the whole rows by a simple loop here.
// Run: ctest -R test_documents
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "core/data/batch_shard.h"
#include "core/data/documents.h"
#include "core/data/megatron_writer.h"
#include "core/data/token_dataset.h"
#include "core/data/window_loader.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

constexpr int64_t E = 9;  // the EOS of these tests
constexpr int64_t X = kIgnoreLabel;

DocumentOptions options(bool mask, bool reset) {
  DocumentOptions o;
  o.mask = mask;
  o.reset_positions = reset;
  o.eos_token_id = E;
  return o;
}

TEST(Documents, StartsPositionsAndLabelsOfTheEdgeCases) {
  // An EOS at 0, a document of 2, two consecutive EOS, one of 1, and an EOS at T - 1.
  const std::vector<int64_t> ids = {E, 4, 5, E, E, 6, E};
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<int64_t> starts;
  eos_document_starts(ids, E, starts);
  EXPECT_EQ(starts, (std::vector<int64_t>{1, 4, 5, 7})) << "7 = T: the last label is cut";
  std::vector<int32_t> doc(static_cast<size_t>(T));
  document_start_of_positions(starts, T, doc.data());
  EXPECT_EQ(doc, (std::vector<int32_t>{0, 1, 1, 1, 4, 5, 5}));

  std::vector<int64_t> labels = {4, 5, E, E, 6, E, 2}, positions(static_cast<size_t>(T), -1);
  apply_documents(options(true, true), starts, doc.data(), 0, T, positions.data(), labels.data());
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(labels, (std::vector<int64_t>{X, 5, E, X, X, E, X})) << "each EOS's label unscored";

  // Columns [2, 5) alone: the same values as the whole row's.
  std::vector<int64_t> slice_labels = {E, E, 6}, slice_positions(3, -1);
  apply_documents(options(true, true), starts, doc.data(), 2, 3, slice_positions.data(),
                  slice_labels.data());
  EXPECT_EQ(slice_positions, (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(slice_labels, (std::vector<int64_t>{E, X, X}));

  // reset_position_ids alone: positions restart, every label stays scored.
  std::vector<int64_t> kept = {4, 5, E, E, 6, E, 2};
  apply_documents(options(false, true), starts, doc.data(), 0, T, positions.data(), kept.data());
  EXPECT_EQ(kept, (std::vector<int64_t>{4, 5, E, E, 6, E, 2}));
  // document_mask alone: the window's positions.
  apply_documents(options(true, false), starts, doc.data(), 0, T, positions.data(), kept.data());
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));

  // No EOS: one document (longer than the window, for all the window can tell).
  starts.clear();
  eos_document_starts(std::vector<int64_t>{1, 2, 3}, E, starts);
  EXPECT_TRUE(starts.empty());
  document_start_of_positions(starts, 3, doc.data());
  EXPECT_EQ(std::vector<int32_t>(doc.begin(), doc.begin() + 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(Documents, StartsOutOfOrderOrOutsideTheWindowAreRefused) {
  std::vector<int32_t> doc(8);
  EXPECT_CONTAINS(error_of([&] {
                    document_start_of_positions(std::vector<int64_t>{3, 2}, 8, doc.data());
                  }),
                  "document start 2 after 3 in a window of 8");
  EXPECT_THROW(document_start_of_positions(std::vector<int64_t>{0}, 8, doc.data()), Error);
  EXPECT_THROW(document_start_of_positions(std::vector<int64_t>{9}, 8, doc.data()), Error);
  EXPECT_THROW(document_start_of_positions(std::vector<int64_t>{4, 4}, 8, doc.data()), Error);
}

// The whole rows' documents by a loop over positions: doc_start, positions and labels of row b.
struct RowDocuments {
  std::vector<int32_t> doc_start;
  std::vector<int64_t> positions, labels;
};
RowDocuments row_documents(const int64_t* ids, const int64_t* labels, int64_t T,
                           const DocumentOptions& o) {
  RowDocuments r;
  int32_t start = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0 && ids[t - 1] == E) start = static_cast<int32_t>(t);
    r.doc_start.push_back(start);
    r.positions.push_back(o.reset_positions ? t - start : t);
    r.labels.push_back(o.mask && ids[t] == E ? X : labels[t]);
  }
  return r;
}

TEST(Documents, EveryRanksBlockOfATokenFileEqualsTheWholeRows) {
  test_support::TempDir dir("moepeak_test_documents");
  const std::string path = (dir.path() / "tokens.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    uint32_t x = 12345;
    for (int i = 0; i < 403; ++i) {  // about one EOS in five; runs of two now and then
      x = x * 1664525u + 1013904223u;
      const uint16_t token =
          (x >> 24) % 5 == 0 ? uint16_t{E} : static_cast<uint16_t>((x >> 8) % 40);
      out.write(reinterpret_cast<const char*>(&token), 2);
    }
  }
  const int64_t B = 4, T = 16;
  for (bool shuffle : {false, true}) {
    for (const auto& [world, sp] :
         {std::pair{1, 1}, std::pair{4, 4}, std::pair{4, 2}, std::pair{8, 4}, std::pair{4, 1}}) {
      for (const DocumentOptions o :
           {options(true, true), options(true, false), options(false, true)}) {
        SCOPED_TRACE(testing::Message() << "shuffle " << shuffle << " W " << world << " Sp " << sp
                                        << " mask " << o.mask << " reset " << o.reset_positions);
        const WindowOrder order{shuffle, 3};
        TokenWindowLoader loader(open_token_bin(path, TokenDtype::uint16), B, T, 40, order);
        for (int step = 0; step < 3; ++step) {
          std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size());
          loader.read_block(loader.whole_batch(), ids.data(), labels.data());
          for (int r = 0; r < world; ++r) {
            const BatchBlock block = rank_batch_block(B, T, world, r, sp);
            const LocalBatch local = read_local_batch(loader, block, o);
            ASSERT_EQ(local.doc_start.size(), o.mask ? static_cast<size_t>(block.rows * T) : 0u);
            for (int64_t i = 0; i < block.rows; ++i) {
              const int64_t b = block.row_begin + i;
              const RowDocuments want =
                  row_documents(ids.data() + b * T, labels.data() + b * T, T, o);
              if (o.mask) {
                EXPECT_EQ(std::vector<int32_t>(local.doc_start.begin() + i * T,
                                               local.doc_start.begin() + (i + 1) * T),
                          want.doc_start)
                    << "the whole sequence's, on every rank of its group";
              }
              for (int64_t c = 0; c < block.cols; ++c) {
                const size_t n = static_cast<size_t>(i * block.cols + c);
                const size_t t = static_cast<size_t>(block.col_begin + c);
                ASSERT_EQ(local.input_ids[n], ids[b * T + t]);
                ASSERT_EQ(local.labels[n], want.labels[t]) << "row " << b << " position " << t;
                ASSERT_EQ(local.positions[n], want.positions[t])
                    << "row " << b << " position " << t;
              }
            }
          }
          loader.advance();
        }
      }
    }
  }
}

// A Megatron dataset whose every document ends with the EOS: its index and its EOS tokens cut the
// windows alike, so both boundaries give every rank the same block.
TEST(Documents, AMegatronIndexCutsWhereItsDocumentsEosDo) {
  test_support::TempDir dir("moepeak_test_documents");
  const std::string prefix = (dir.path() / "web").string();
  {
    MegatronWriter out(prefix, TokenStorage::u16);
    uint32_t x = 99;
    for (int d = 0; d < 60; ++d) {
      x = x * 1664525u + 1013904223u;
      std::vector<int32_t> doc(1 + (x >> 16) % 11);  // 1 to 11 tokens, the last the EOS
      for (size_t i = 0; i + 1 < doc.size(); ++i) doc[i] = static_cast<int32_t>((x >> (i % 8)) % 8);
      doc.back() = E;
      out.add_document(doc);
    }
    out.commit();
  }
  const int64_t B = 4, T = 16;
  for (bool shuffle : {false, true}) {
    for (const auto& [world, sp] : {std::pair{1, 1}, std::pair{4, 4}, std::pair{4, 2}}) {
      SCOPED_TRACE(testing::Message() << "shuffle " << shuffle << " W " << world << " Sp " << sp);
      const WindowOrder order{shuffle, 7};
      TokenWindowLoader loader(open_megatron_dataset(prefix), B, T, 40, order);
      DocumentOptions eos = options(true, true), index = eos;
      index.boundaries = DocumentBoundaries::index;
      for (int step = 0; step < 8; ++step) {  // past the end of the stream in file order
        for (int r = 0; r < world; ++r) {
          const BatchBlock block = rank_batch_block(B, T, world, r, sp);
          const LocalBatch by_eos = read_local_batch(loader, block, eos);
          const LocalBatch by_index = read_local_batch(loader, block, index);
          EXPECT_EQ(by_index.doc_start, by_eos.doc_start) << "step " << step << " rank " << r;
          EXPECT_EQ(by_index.positions, by_eos.positions);
          EXPECT_EQ(by_index.labels, by_eos.labels);
          EXPECT_EQ(by_index.input_ids, by_eos.input_ids);
        }
        loader.advance();
      }
    }
  }
}

TEST(Documents, IndexBoundariesNeedADocumentIndex) {
  test_support::TempDir dir("moepeak_test_documents");
  const std::string path = (dir.path() / "tokens.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    for (uint16_t i = 0; i < 40; ++i) out.write(reinterpret_cast<const char*>(&i), 2);
  }
  TokenWindowLoader loader(open_token_bin(path, TokenDtype::uint16), 2, 8, 40, WindowOrder{});
  DocumentOptions o = options(true, false);
  o.boundaries = DocumentBoundaries::index;
  const std::string e = error_of([&] { read_local_batch(loader, loader.whole_batch(), o); });
  EXPECT_CONTAINS(e, "training.document_boundaries = \"index\" needs a Megatron dataset");
  EXPECT_CONTAINS(e, path);
}

}  // namespace
}  // namespace moepeak
