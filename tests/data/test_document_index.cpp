// Document boundaries from a Megatron dataset's own index (training.document_boundaries =
// "index": DataLoader::read_document_starts, TokenDataset::document_starts, DocumentIndex in
// core/data/token_dataset.h). Every answer is checked against a brute force computed here from
// the documents' token lengths: a flag per stream position, set where a document starts, and
// the offsets o in [1, T] whose position (p + o) mod N is flagged. The token at stream position i
// is i (plus a base per dataset), so each row's window start p is read back from its first input,
// the same sample numbering read_block uses, in file order (windows that wrap past the end) and
// shuffled. Datasets: MegatronWriter's (one sequence per document; length-1 documents, documents
// longer than T), hand-written .idx files (documents of several sequences, empty documents and
// sequences, pointers out of order with gaps, a stream that starts past sequence 0), blends, and
// 50,000-document datasets whose queries cross the sparse tables' 1024-entry blocks. Answers are
// appended (a value put in first stays), the cursor does not move, and the sources without an
// index (.bin, the copy task, a blend's .bin member) throw naming themselves.
// Run: ctest -R test_document_index
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/copy_task.h"
#include "core/data/data_loader.h"
#include "core/data/megatron_writer.h"
#include "core/data/token_dataset.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

constexpr int64_t kPoison = -7;  // put in `starts` before each call: answers are appended after it

// Where documents start: flags[p] for each stream position p in [0, N). A document starting at N
// (a trailing empty one) is position 0 again.
std::vector<bool> start_flags(const std::vector<uint64_t>& document_starts, uint64_t N) {
  std::vector<bool> flags(N, false);
  for (uint64_t p : document_starts) flags[p % N] = true;
  return flags;
}

// The brute force: every o in [1, count] with (begin + o) mod N flagged, ascending.
std::vector<int64_t> brute_starts(const std::vector<bool>& flags, uint64_t begin, uint64_t count) {
  std::vector<int64_t> out;
  for (uint64_t o = 1; o <= count; ++o)
    if (flags[(begin + o) % flags.size()]) out.push_back(static_cast<int64_t>(o));
  return out;
}

// The starts of documents of these lengths, one after another from 0.
std::vector<uint64_t> cumulative_starts(const std::vector<int32_t>& lengths) {
  std::vector<uint64_t> starts;
  uint64_t at = 0;
  for (int32_t l : lengths) {
    starts.push_back(at);
    at += static_cast<uint64_t>(l);
  }
  return starts;
}

uint64_t total(const std::vector<int32_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), uint64_t{0});
}

// A dataset's tokens as the test sees them: stream position i holds base + i.
struct Source {
  int64_t base = 0;
  std::vector<bool> flags;  // N of them
};

// A hand-written index: sequence lengths, the document index's entries (first sequence of each
// document, then S), and the sequence placed first in the .bin (the rest follow in a shuffled
// order, each after a gap).
struct HandIndex {
  std::vector<int32_t> lengths;
  std::vector<int64_t> entries;
};

class DocumentIndexTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (temp_.path() / name).string(); }

  // MegatronWriter: documents of these lengths, the token at stream position i = base + i.
  std::string write_documents(const std::string& name, const std::vector<int32_t>& lengths,
                              TokenStorage storage, int64_t base = 0) {
    const std::string prefix = path(name);
    MegatronWriter out(prefix, storage);
    std::vector<int32_t> ids;
    int64_t next = base;
    for (int32_t l : lengths) {
      ids.resize(static_cast<size_t>(l));
      for (int32_t& id : ids) id = static_cast<int32_t>(next++);
      out.add_document(ids);
    }
    out.commit();
    return prefix;
  }

  // An int32 .bin/.idx with `index`'s sequences stored in a shuffled order, each after a gap of
  // two tokens of junk (-1, never read: only sequences are), the stream's token at position i
  // = base + i. Sequences before entries[0] are not in the stream; their tokens are junk too.
  std::string write_hand(const std::string& name, const HandIndex& index, uint64_t seed,
                         int64_t base = 0) {
    const size_t S = index.lengths.size();
    std::vector<size_t> placement(S);
    std::iota(placement.begin(), placement.end(), size_t{0});
    std::mt19937_64 rng(seed);
    std::shuffle(placement.begin(), placement.end(), rng);
    const auto first = static_cast<size_t>(index.entries.front());
    std::vector<int64_t> stream_at(S, 0);  // stream position of each sequence's first token
    int64_t at = 0;
    for (size_t s = first; s < S; ++s) {
      stream_at[s] = at;
      at += index.lengths[s];
    }
    std::vector<int32_t> bin;
    std::vector<int64_t> pointers(S);
    for (size_t s : placement) {
      bin.push_back(-1);
      bin.push_back(-1);
      pointers[s] = static_cast<int64_t>(bin.size() * 4);
      for (int32_t t = 0; t < index.lengths[s]; ++t)
        bin.push_back(s < first ? -1 : static_cast<int32_t>(base + stream_at[s] + t));
    }
    std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    append<uint64_t>(idx, 1);
    idx.push_back(4);  // int32
    append<uint64_t>(idx, S);
    append<uint64_t>(idx, index.entries.size());
    for (int32_t l : index.lengths) append<int32_t>(idx, l);
    for (int64_t p : pointers) append<int64_t>(idx, p);
    for (int64_t e : index.entries) append<int64_t>(idx, e);
    const std::string prefix = path(name);
    write_file(prefix + ".idx", idx.data(), idx.size());
    write_file(prefix + ".bin", bin.data(), bin.size() * 4);
    return prefix;
  }

  // The brute force's flags for a hand-written index: each document starts where the lengths
  // of the stream's sequences before its first one end.
  static std::vector<bool> hand_flags(const HandIndex& index) {
    const auto first = static_cast<size_t>(index.entries.front());
    std::vector<uint64_t> prefix = {0};  // prefix[s - first]: stream position of sequence s
    for (size_t s = first; s < index.lengths.size(); ++s)
      prefix.push_back(prefix.back() + static_cast<uint64_t>(index.lengths[s]));
    std::vector<uint64_t> starts;
    for (size_t d = 0; d + 1 < index.entries.size(); ++d)
      starts.push_back(prefix[static_cast<size_t>(index.entries[d]) - first]);
    return start_flags(starts, prefix.back());
  }

  template <typename T>
  static void append(std::vector<uint8_t>& bytes, T value) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    bytes.insert(bytes.end(), raw, raw + sizeof(T));
  }
  static void write_file(const std::string& p, const void* data, size_t bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }

  static TrainingConfig training(const std::string& dataset_path, int64_t B, int64_t T,
                                 bool shuffle, DatasetKind kind = DatasetKind::megatron) {
    TrainingConfig t;
    t.dataset = kind;
    t.dataset_path = dataset_path;
    t.token_dtype = TokenDtype::uint16;
    t.batch_size = B;
    t.seq_len = T;
    t.shuffle = shuffle;
    return t;
  }
  static ModelConfig model(int64_t vocab = int64_t{1} << 24) {
    ModelConfig m;
    m.vocab_size = vocab;
    return m;
  }

  // Reads `batches` batches, checking each row's document starts against the brute force of
  // the source its tokens come from (its window start p read from its first input), and that
  // the row is that source's stream from p (the premise of reading p back). Asking does not move
  // the cursor: the state and a second read_block are unchanged. Returns the rows with no start.
  static int expect_rows_match(DataLoader& loader, const std::vector<Source>& sources,
                               int batches) {
    const int64_t B = loader.batch_size(), T = loader.seq_len();
    std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size());
    std::vector<int64_t> again(ids.size()), again_labels(ids.size());
    int empty_rows = 0;
    for (int k = 0; k < batches; ++k) {
      loader.read_block(loader.whole_batch(), ids.data(), labels.data());
      const std::vector<uint8_t> state = loader.state();
      for (int64_t row = 0; row < B; ++row) {
        const int64_t first = ids[static_cast<size_t>(row * T)];
        const auto source = std::find_if(sources.begin(), sources.end(), [&](const Source& s) {
          return first >= s.base && first < s.base + static_cast<int64_t>(s.flags.size());
        });
        if (source == sources.end()) {
          ADD_FAILURE() << "batch " << k << " row " << row << ": token " << first;
          return empty_rows;
        }
        const uint64_t N = source->flags.size();
        const auto p = static_cast<uint64_t>(first - source->base);
        for (int64_t t = 0; t < T; ++t) {
          if (ids[static_cast<size_t>(row * T + t)] !=
              source->base + static_cast<int64_t>((p + static_cast<uint64_t>(t)) % N)) {
            ADD_FAILURE() << "batch " << k << " row " << row << " t " << t
                          << ": not the stream from " << p;
            return empty_rows;
          }
        }
        std::vector<int64_t> starts = {kPoison};
        loader.read_document_starts(row, starts);
        std::vector<int64_t> expected = {kPoison};
        const std::vector<int64_t> brute = brute_starts(source->flags, p, static_cast<uint64_t>(T));
        expected.insert(expected.end(), brute.begin(), brute.end());
        EXPECT_EQ(starts, expected)
            << "batch " << k << " row " << row << " from p = " << p << " of N = " << N;
        empty_rows += brute.empty() ? 1 : 0;
      }
      EXPECT_EQ(loader.state(), state) << "read_document_starts moved the cursor";
      loader.read_block(loader.whole_batch(), again.data(), again_labels.data());
      EXPECT_EQ(again, ids);
      EXPECT_EQ(again_labels, labels);
      loader.advance();
    }
    return empty_rows;
  }

  // Queries TokenDataset::document_starts directly at `begins` x `counts` against the brute force.
  static void expect_queries_match(const TokenDataset& dataset, const std::vector<bool>& flags,
                                   const std::vector<uint64_t>& begins,
                                   const std::vector<uint64_t>& counts) {
    ASSERT_EQ(dataset.token_count(), flags.size());
    for (uint64_t begin : begins) {
      for (uint64_t count : counts) {
        std::vector<int64_t> got = {kPoison};
        dataset.document_starts(begin, count, got);
        std::vector<int64_t> expected = {kPoison};
        const std::vector<int64_t> brute = brute_starts(flags, begin, count);
        expected.insert(expected.end(), brute.begin(), brute.end());
        ASSERT_EQ(got, expected) << "begin " << begin << " count " << count;
      }
    }
  }

  test_support::TempDir temp_{"moepeak_test_document_index"};
};

// Random lengths in [1, max_length], about one in five of them 1.
std::vector<int32_t> random_lengths(size_t documents, int32_t max_length, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> length(1, max_length);
  std::uniform_int_distribution<int> one(0, 4);
  std::vector<int32_t> out(documents);
  for (int32_t& l : out) l = one(rng) == 0 ? 1 : length(rng);
  return out;
}

TEST_F(DocumentIndexTest, HandCheckedWindowsInFileOrder) {
  // Documents of 5, 7, 3 tokens start at 0, 5, 12 (N = 15); T = 4, B = 2: windows from 0, 4 | 8,
  // 12 | 1, 5. From 8, the document at 12 is the window's last label (o = T); from 12 the window
  // wraps to the start at 15 = 0 (o = 3); from 5 the window's own start (o = 0) is not listed.
  const std::string prefix = write_documents("hand", {5, 7, 3}, TokenStorage::u16);
  auto loader = make_data_loader(training(prefix, 2, 4, false), model(), 0);
  const std::vector<std::vector<int64_t>> expected = {{}, {1}, {4}, {3}, {4}, {}};
  for (size_t w = 0; w < expected.size(); ++w) {
    std::vector<int64_t> starts;
    loader->read_document_starts(static_cast<int64_t>(w % 2), starts);
    EXPECT_EQ(starts, expected[w]) << "window " << w;
    if (w % 2 == 1) loader->advance();
  }
}

TEST_F(DocumentIndexTest, WriterDatasetsInFileOrderAndShuffledMatchTheBruteForce) {
  const std::vector<int32_t> lengths = random_lengths(60, 40, 11);  // N about 1,200
  const uint64_t N = total(lengths);
  const std::vector<bool> flags = start_flags(cumulative_starts(lengths), N);
  const std::string prefix = write_documents("random", lengths, TokenStorage::u16, 100);
  const std::vector<Source> sources = {{100, flags}};
  // T smaller than most documents, about their size, and larger than every one.
  for (int64_t T : {3, 16, 64}) {
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE(testing::Message() << "T " << T << (shuffle ? " shuffled" : " file order"));
      auto loader = make_data_loader(training(prefix, 5, T, shuffle), model(), 3);
      // Enough batches for two passes over the stream: file-order windows wrap past the end,
      // the shuffled order starts a second epoch.
      const auto batches = static_cast<int>(2 * N / static_cast<uint64_t>(5 * T) + 2);
      expect_rows_match(*loader, sources, batches);
    }
  }
}

TEST_F(DocumentIndexTest, ADocumentLongerThanTheWindowGivesEmptyRows) {
  const std::vector<int32_t> lengths = {3, 500, 1, 1, 2, 300};
  const std::string prefix = write_documents("long", lengths, TokenStorage::u16);
  const std::vector<Source> sources = {
      {0, start_flags(cumulative_starts(lengths), total(lengths))}};
  auto loader = make_data_loader(training(prefix, 4, 16, false), model(), 0);
  // 807 tokens in windows of 16: about 50 windows inside the two long documents.
  EXPECT_GE(expect_rows_match(*loader, sources, 26), 40);
  // One by hand: the window from 16 lies inside the 500-token document [3, 503).
  auto first = make_data_loader(training(prefix, 4, 16, false), model(), 0);
  std::vector<int64_t> starts = {kPoison};
  first->read_document_starts(1, starts);
  EXPECT_EQ(starts, std::vector<int64_t>{kPoison});
}

TEST_F(DocumentIndexTest, HandWrittenIndexCountsPositionsFromTheLengths) {
  // Sequences of 3, 0, 4, 0, 0, 2, 5 tokens; the documents: [] (no sequences), {0, 1}, {2},
  // {3, 4} (only empty sequences), [] (none), {5, 6}, [] (none, trailing). They start at 0, 0,
  // 3, 7, 7, 7 and 14 = N: positions 0, 3, 7, each once. The .bin holds the sequences out of
  // order with gaps.
  const HandIndex index{{3, 0, 4, 0, 0, 2, 5}, {0, 0, 2, 3, 5, 5, 7, 7}};
  const std::string prefix = write_hand("hand", index, 5);
  const TokenDataset dataset = open_megatron_dataset(prefix);
  ASSERT_TRUE(dataset.has_document_index());
  ASSERT_EQ(dataset.token_count(), 14u);
  std::vector<int64_t> got = {kPoison};
  dataset.document_starts(0, 14, got);  // positions 1 .. 14, 14 = 0
  EXPECT_EQ(got, (std::vector<int64_t>{kPoison, 3, 7, 14}));
  got.clear();
  dataset.document_starts(5, 9, got);  // positions 6 .. 14
  EXPECT_EQ(got, (std::vector<int64_t>{2, 9}));
  got.clear();
  dataset.document_starts(20, 3, got);  // begin 20 = 6: positions 7, 8, 9
  EXPECT_EQ(got, (std::vector<int64_t>{1}));
  got.clear();
  dataset.document_starts(3, 0, got);
  EXPECT_TRUE(got.empty());

  std::vector<uint64_t> every_begin(dataset.token_count());
  std::iota(every_begin.begin(), every_begin.end(), uint64_t{0});
  expect_queries_match(dataset, hand_flags(index), every_begin, {1, 2, 3, 4, 7, 13, 14});
}

TEST_F(DocumentIndexTest, HandWrittenIndexesOfSeveralSequencesThroughTheLoader) {
  // Documents of several sequences, empty documents at the start, middle and end, zero-length
  // sequences (also as a document's first), and a stream that starts at sequence 2 (sequences 0
  // and 1 are outside every document and never counted).
  std::mt19937_64 rng(21);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    HandIndex index;
    const int64_t first = variant == 2 ? 2 : 0;
    index.lengths.assign(static_cast<size_t>(first), 9);
    index.entries = {first};
    if (variant >= 1) index.entries.push_back(first);  // an empty first document
    std::uniform_int_distribution<int> pieces(0, 4), length(0, 9);
    for (int d = 0; d < 40; ++d) {
      const int n = pieces(rng);  // 0: an empty document
      for (int i = 0; i < n; ++i) index.lengths.push_back(length(rng) < 2 ? 0 : length(rng));
      index.entries.push_back(static_cast<int64_t>(index.lengths.size()));
    }
    index.entries.push_back(static_cast<int64_t>(index.lengths.size()));  // an empty last one
    const std::vector<bool> flags = hand_flags(index);
    const std::string prefix =
        write_hand("several" + std::to_string(variant), index, 7 + variant, 1000);
    for (bool shuffle : {false, true}) {
      for (int64_t T : {5, 37}) {
        SCOPED_TRACE(testing::Message() << "T " << T << (shuffle ? " shuffled" : " file order"));
        auto loader = make_data_loader(training(prefix, 3, T, shuffle), model(), 9);
        expect_rows_match(*loader, {{1000, flags}}, static_cast<int>(flags.size() / 10 + 3));
      }
    }
  }
}

TEST_F(DocumentIndexTest, ABlendAsksEachRowsOwnDataset) {
  const std::vector<int32_t> a = random_lengths(50, 30, 31), b = random_lengths(70, 12, 32);
  const std::string pa = write_documents("a", a, TokenStorage::u16, 0);
  const std::string pb = write_documents("b", b, TokenStorage::u16, 30000);
  const std::vector<Source> sources = {{0, start_flags(cumulative_starts(a), total(a))},
                                       {30000, start_flags(cumulative_starts(b), total(b))}};
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "file order");
    TrainingConfig t = training("", 6, 9, shuffle);
    t.dataset_path.clear();
    t.datasets = {{pa, 0.6, {}}, {pb, 0.4, {}}};
    auto loader = make_data_loader(t, model(), 5);
    expect_rows_match(*loader, sources, 60);  // both datasets wrap or start new epochs
    EXPECT_GT(loader->shares()[0].samples, 0u);
    EXPECT_GT(loader->shares()[1].samples, 0u);
  }
}

TEST_F(DocumentIndexTest, ABlendsBinMemberThrowsNamingItsFile) {
  const std::vector<int32_t> a = random_lengths(40, 20, 41);
  const std::string pa = write_documents("a", a, TokenStorage::u16, 0);
  const std::string bin = path("plain.bin");
  {
    std::vector<uint16_t> tokens(400);
    std::iota(tokens.begin(), tokens.end(), uint16_t{40000});
    write_file(bin, tokens.data(), tokens.size() * 2);
  }
  TrainingConfig t = training("", 4, 8, false);
  t.dataset_path.clear();
  t.datasets = {{pa, 0.5, {}}, {bin, 0.5, DatasetKind::bin}};
  auto loader = make_data_loader(t, model(), 0);
  const std::vector<bool> flags = start_flags(cumulative_starts(a), total(a));
  std::vector<int64_t> ids(32), labels(32);
  int megatron_rows = 0, bin_rows = 0;
  for (int k = 0; k < 5; ++k) {
    loader->read_block(loader->whole_batch(), ids.data(), labels.data());
    for (int64_t row = 0; row < 4; ++row) {
      const int64_t first = ids[static_cast<size_t>(row * 8)];
      std::vector<int64_t> starts;
      if (first >= 40000) {
        ++bin_rows;
        const std::string message = error_of([&] { loader->read_document_starts(row, starts); });
        EXPECT_CONTAINS(message,
                        "training.document_boundaries = \"index\" needs a Megatron dataset (its "
                        ".idx lists the documents); training.datasets[1] (" +
                            bin + ": headerless uint16 .bin");
        EXPECT_CONTAINS(message, ") has no document index — use \"eos\"");
      } else {
        ++megatron_rows;
        loader->read_document_starts(row, starts);
        EXPECT_EQ(starts, brute_starts(flags, static_cast<uint64_t>(first), 8));
      }
    }
    loader->advance();
  }
  EXPECT_EQ(megatron_rows, 10);
  EXPECT_EQ(bin_rows, 10);
}

TEST_F(DocumentIndexTest, SourcesWithoutAnIndexThrowTheDefaultMessage) {
  const std::string bin = path("plain.bin");
  {
    std::vector<uint16_t> tokens(100, 3);
    write_file(bin, tokens.data(), tokens.size() * 2);
  }
  for (bool shuffle : {false, true}) {
    auto loader = make_data_loader(training(bin, 2, 8, shuffle, DatasetKind::bin), model(1000), 0);
    const std::vector<uint8_t> state = loader->state();
    std::vector<int64_t> starts = {kPoison};
    EXPECT_EQ(error_of([&] { loader->read_document_starts(1, starts); }),
              "training.document_boundaries = \"index\" needs a Megatron dataset (its .idx lists "
              "the documents); " +
                  loader->describe() + " has no document index — use \"eos\"");
    EXPECT_EQ(starts, std::vector<int64_t>{kPoison});
    EXPECT_EQ(loader->state(), state);
  }
  CopyTaskLoader copy(2, 8, 100, 0);
  std::vector<int64_t> starts;
  EXPECT_EQ(error_of([&] { copy.read_document_starts(0, starts); }),
            "training.document_boundaries = \"index\" needs a Megatron dataset (its .idx lists "
            "the documents); " +
                copy.describe() + " has no document index — use \"eos\"");
  const TokenDataset plain = open_token_bin(bin, TokenDtype::uint16);
  EXPECT_FALSE(plain.has_document_index());
  EXPECT_THROW(plain.document_starts(0, 4, starts), Error);
}

TEST_F(DocumentIndexTest, FiftyThousandDocumentsAcrossTheSparseTables) {
  // 50,000 documents of 1 to 8 tokens (N about 225,000, int32 ids): 49 blocks of 1,024
  // documents in each table. Queries begin just before, at and after each block's first
  // document, at random and at the end of the stream, and span up to several blocks.
  const std::vector<int32_t> lengths = random_lengths(50000, 8, 51);
  const std::vector<uint64_t> starts = cumulative_starts(lengths);
  const uint64_t N = total(lengths);
  const std::vector<bool> flags = start_flags(starts, N);
  const std::string prefix = write_documents("many", lengths, TokenStorage::i32);
  const TokenDataset dataset = open_megatron_dataset(prefix);
  std::vector<uint64_t> begins = {0, 1, N - 1, N - 2, N - 9000, N + 5};
  for (size_t d = 0; d < starts.size(); d += DocumentIndex::kStride) {
    for (uint64_t back : {0, 1, 2, 9, 600, 4700}) begins.push_back((starts[d] + N - back) % N);
    begins.push_back(starts[d] + 1);
  }
  std::mt19937_64 rng(52);
  for (int i = 0; i < 100; ++i) begins.push_back(rng() % N);
  expect_queries_match(dataset, flags, begins, {1, 2, 8, 1000, 4608, 12000});

  auto loader = make_data_loader(training(prefix, 4, 2048, false), model(), 0);
  expect_rows_match(*loader, {{0, flags}}, 30);  // past the end of the stream and round again
  auto shuffled = make_data_loader(training(prefix, 8, 300, true), model(), 17);
  expect_rows_match(*shuffled, {{0, flags}}, 10);
}

TEST_F(DocumentIndexTest, ManyDocumentsOfSeveralSequencesAcrossTheSparseTables) {
  // 20,000 documents of 0 to 5 sequences of 0 to 6 tokens, and one of 3,000 sequences (more
  // than a block: the next document's position comes from the sequence table), stored in a
  // shuffled order: the two tables' blocks fall at different places.
  std::mt19937_64 rng(61);
  std::uniform_int_distribution<int> pieces(0, 5), length(0, 6);
  HandIndex index;
  index.entries = {0};
  for (int d = 0; d < 20000; ++d) {
    const int n = d == 7000 ? 3000 : pieces(rng);
    for (int i = 0; i < n; ++i) index.lengths.push_back(length(rng));
    index.entries.push_back(static_cast<int64_t>(index.lengths.size()));
  }
  const std::vector<bool> flags = hand_flags(index);
  const uint64_t N = flags.size();
  const TokenDataset dataset = open_megatron_dataset(write_hand("several", index, 62));
  std::vector<uint64_t> sequence_at = {0};  // stream position of each sequence
  for (int32_t l : index.lengths) sequence_at.push_back(sequence_at.back() + uint64_t(l));
  std::vector<uint64_t> begins = {0, N - 1, N - 3000};
  for (size_t d = 0; d + 1 < index.entries.size(); d += 97) {
    const uint64_t at = sequence_at[static_cast<size_t>(index.entries[d])];
    begins.push_back(at);
    begins.push_back((at + N - 1) % N);
  }
  for (size_t d : {6999, 7000, 7001}) {  // around the long document, walking over it
    const uint64_t at = sequence_at[static_cast<size_t>(index.entries[d])];
    begins.push_back(at);
    begins.push_back((at + N - 1) % N);
  }
  for (int i = 0; i < 100; ++i) begins.push_back(rng() % N);
  expect_queries_match(dataset, flags, begins, {1, 5, 64, 2000, 9000, 25000});
}

TEST_F(DocumentIndexTest, ARowOutsideTheBatchIsAnError) {
  const std::string prefix = write_documents("small", {4, 4, 4}, TokenStorage::u16);
  auto loader = make_data_loader(training(prefix, 2, 4, false), model(), 0);
  std::vector<int64_t> starts;
  EXPECT_THROW(loader->read_document_starts(2, starts), Error);
  EXPECT_THROW(loader->read_document_starts(-1, starts), Error);
}

}  // namespace
}  // namespace moepeak
