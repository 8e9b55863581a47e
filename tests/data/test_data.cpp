// Tests of the training data loaders: the copy task's structure, its sequences indexed by sample
// (the same for any batch size), its generator's fixed values, determinism and resume; llm.c /
// nanoGPT .bin files (headerless uint16/uint32 and llm.c's headered form) and Megatron .bin/.idx
// datasets written here byte by byte, their windows, wrap-around and resume; and every error,
// whose message must name the file and the position.
#include <gtest/gtest.h>

#include <stdlib.h>
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/copy_task.h"
#include "core/data/data_loader.h"
#include "core/data/token_dataset.h"
#include "core/error.h"

namespace moepeak {
namespace {

struct Batch {
  std::vector<int64_t> inputs, labels;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader) {
  const size_t n = static_cast<size_t>(loader.batch_size() * loader.seq_len());
  Batch b{std::vector<int64_t>(n), std::vector<int64_t>(n)};
  loader.next_batch(b.inputs.data(), b.labels.data());
  return b;
}

using test_support::error_of;

// ---- Copy task --------------------------------------------------------------------------------

void expect_copy_structure(int64_t B, int64_t T, int64_t V) {
  SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T);
  CopyTaskLoader loader(B, T, V, /*seed=*/7);
  const int64_t h = T / 2;
  for (int step = 0; step < 3; ++step) {
    Batch batch = next(loader);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t* in = batch.inputs.data() + b * T;
      const int64_t* lab = batch.labels.data() + b * T;
      int scored = 0;
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_GE(in[t], 0);
        ASSERT_LT(in[t], V);
        if (t >= h) {
          EXPECT_EQ(in[t], in[t - h]) << "the second half repeats the first";
        }
        if (t + 1 < h) {
          EXPECT_EQ(lab[t], kIgnoreLabel) << "t=" << t << " is in the random half";
        } else {
          ++scored;
          EXPECT_EQ(lab[t], in[t + 1 - h]) << "a scored label is the token h positions back";
          if (t + 1 < T) {
            EXPECT_EQ(lab[t], in[t + 1]) << "labels are the next input";
          }
          EXPECT_EQ(lab[t], copy_task_random_token(7, step * B + b, (t + 1) % h, V));
        }
      }
      EXPECT_EQ(scored, T - h + 1);
      for (int64_t i = 0; i < h; ++i)
        EXPECT_EQ(in[i], copy_task_random_token(7, step * B + b, i, V)) << "sequence j = k*B + b";
    }
  }
}

TEST(CopyTask, StructureEvenAndOddLengths) {
  expect_copy_structure(3, 8, 50);
  expect_copy_structure(3, 9, 50);
  expect_copy_structure(2, 2, 5);
  expect_copy_structure(2, 3, 5);
  expect_copy_structure(1, 128, 256);
}

TEST(CopyTask, ExactLayoutForTEquals5) {
  // T = 5: h = 2, tokens = r0 r1 r0 r1 r0 r1; inputs r0 r1 r0 r1 r0; labels -100 r0 r1 r0 r1.
  CopyTaskLoader loader(1, 5, 1000, 3);
  Batch b = next(loader);
  const int64_t r0 = copy_task_random_token(3, 0, 0, 1000);
  const int64_t r1 = copy_task_random_token(3, 0, 1, 1000);
  EXPECT_EQ(b.inputs, (std::vector<int64_t>{r0, r1, r0, r1, r0}));
  EXPECT_EQ(b.labels, (std::vector<int64_t>{kIgnoreLabel, r0, r1, r0, r1}));
}

TEST(CopyTask, RejectsBadShapes) {
  EXPECT_CONTAINS(error_of([] { CopyTaskLoader(1, 1, 10, 0); }), "training.seq_len 1");
  EXPECT_CONTAINS(error_of([] { CopyTaskLoader(0, 8, 10, 0); }), "training.batch_size 0");
  EXPECT_CONTAINS(error_of([] { CopyTaskLoader(1, 8, 0, 0); }), "model.vocab_size 0");
}

TEST(CopyTask, DeterministicFromSeedAndSample) {
  CopyTaskLoader a(4, 16, 100, 1234), b(4, 16, 100, 1234), c(4, 16, 100, 1235);
  Batch first_a = next(a);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(i == 0 ? first_a : next(a), next(b));
  EXPECT_NE(first_a, next(c)) << "another seed gives other data";
  // Rows differ from each other and steps differ from each other.
  CopyTaskLoader d(2, 16, 100, 1234);
  Batch s0 = next(d), s1 = next(d);
  EXPECT_NE(s0, s1);
  EXPECT_FALSE(std::equal(s0.inputs.begin(), s0.inputs.begin() + 16, s0.inputs.begin() + 16));
}

TEST(CopyTask, TokensCoverTheVocabulary) {
  CopyTaskLoader loader(8, 64, 7, 99);
  std::set<int64_t> seen;
  for (int i = 0; i < 4; ++i) {
    Batch b = next(loader);
    seen.insert(b.inputs.begin(), b.inputs.end());
  }
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 6);
}

TEST(CopyTask, SequenceJIsTheSameForAnyBatchSize) {
  // 24 sequences read as 3 batches of 8, 8 of 3, 24 of 1 and 6 of 4 (one poisoned block of
  // rows [1, 3) each time, the rest whole): the same sequences in the same order.
  const int64_t T = 11, V = 97;
  std::vector<Batch> runs;
  for (int64_t B : {8, 3, 1, 4}) {
    SCOPED_TRACE(testing::Message() << "B=" << B);
    CopyTaskLoader loader(B, T, V, 21);
    Batch run;
    for (int64_t k = 0; k < 24 / B; ++k) {
      EXPECT_EQ(loader.sample(), k * B);
      Batch batch{std::vector<int64_t>(static_cast<size_t>(B * T), -7),
                  std::vector<int64_t>(static_cast<size_t>(B * T), -7)};
      loader.read_block(loader.whole_batch(), batch.inputs.data(), batch.labels.data());
      if (B >= 3) {  // a block of rows [1, 3), positions [2, 9): those values of the batch
        const BatchBlock block{1, 2, 2, 7};
        std::vector<int64_t> in(14, -7), lab(14, -7);
        loader.read_block(block, in.data(), lab.data());
        for (int64_t r = 0; r < 2; ++r) {
          for (int64_t c = 0; c < 7; ++c) {
            EXPECT_EQ(in[r * 7 + c], batch.inputs[(1 + r) * T + 2 + c]);
            EXPECT_EQ(lab[r * 7 + c], batch.labels[(1 + r) * T + 2 + c]);
          }
        }
      }
      loader.advance();
      run.inputs.insert(run.inputs.end(), batch.inputs.begin(), batch.inputs.end());
      run.labels.insert(run.labels.end(), batch.labels.begin(), batch.labels.end());
    }
    runs.push_back(run);
  }
  ASSERT_EQ(runs[0].inputs.size(), static_cast<size_t>(24 * T));
  for (size_t r = 1; r < runs.size(); ++r) EXPECT_EQ(runs[r], runs[0]) << "run " << r;
  // Sequences differ from each other.
  EXPECT_FALSE(
      std::equal(runs[0].inputs.begin(), runs[0].inputs.begin() + T, runs[0].inputs.begin() + T));
}

TEST(CopyTask, TheGeneratorsValuesAreFixed) {
  // The tokens a checkpoint's state points at: a change of the generator (another hash, another
  // key) would make a resume read other sequences, so it must change the state's layout too.
  // The values are those of an independent Python transcription of copy_task.cpp's hash
  // (splitmix64 rounds over seed, sample, index from "moepeak1", then Lemire's multiply-shift).
  EXPECT_EQ(copy_task_random_token(1234, 0, 0, 256), 236);
  EXPECT_EQ(copy_task_random_token(1234, 0, 1, 256), 246);
  EXPECT_EQ(copy_task_random_token(1234, 1, 0, 256), 104);
  EXPECT_EQ(copy_task_random_token(1234, 123456789, 63, 256), 63);
  EXPECT_EQ(copy_task_random_token(-5, 7, 3, 1000003), 631507);
}

TEST(CopyTask, StateRestoreResumesExactly) {
  CopyTaskLoader run(3, 10, 64, 5);
  for (int i = 0; i < 3; ++i) next(run);
  std::vector<uint8_t> saved = run.state();
  std::vector<Batch> expected;
  for (int i = 0; i < 4; ++i) expected.push_back(next(run));

  CopyTaskLoader resumed(3, 10, 64, 5);
  next(resumed);  // history before restore does not matter
  resumed.restore(saved);
  EXPECT_EQ(resumed.sample(), 9);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(next(resumed), expected[static_cast<size_t>(i)]);

  // Layout: "MPDL", version 1, kind 0 (copy), 2 fields: sample index 9 = 3 batches of 3, seed 5.
  ASSERT_EQ(saved.size(), 24u);
  EXPECT_EQ(std::string(saved.begin(), saved.begin() + 4), "MPDL");
  EXPECT_EQ(saved[4], 1);
  EXPECT_EQ(saved[5], 0);
  EXPECT_EQ(saved[6], 2);
  EXPECT_EQ(saved[8], 9);
  EXPECT_EQ(saved[16], 5);
}

TEST(CopyTask, AStateResumesAtAnotherBatchSize) {
  // Saved after 2 batches of 6 (sample 12), resumed with batches of 4 and of 12: each continues
  // with sequence 12, as a run of 4 or 12 from the start would after 12 sequences.
  CopyTaskLoader saved_run(6, 8, 50, 9);
  next(saved_run);
  next(saved_run);
  const std::vector<uint8_t> saved = saved_run.state();
  for (int64_t B : {4, 12}) {
    SCOPED_TRACE(testing::Message() << "B=" << B);
    CopyTaskLoader from_start(B, 8, 50, 9), resumed(B, 8, 50, 9);
    for (int64_t k = 0; k < 12 / B; ++k) next(from_start);
    resumed.restore(saved);
    EXPECT_EQ(resumed.sample(), 12);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(next(resumed), next(from_start));
  }
}

TEST(CopyTask, RestoreRejectsForeignOrDamagedState) {
  CopyTaskLoader loader(1, 4, 10, 0);
  std::vector<uint8_t> good = loader.state();
  std::vector<uint8_t> short_state(good.begin(), good.end() - 1);
  EXPECT_CONTAINS(error_of([&] { loader.restore(short_state); }), "bytes");
  EXPECT_CONTAINS(error_of([&] {
                    loader.restore(std::vector<uint8_t>{1, 2, 3});
                  }),
                  "not a moepeak data-loader state");
  const uint64_t fields[] = {0, 100};
  std::vector<uint8_t> bin_state = encode_loader_state(LoaderKind::bin, fields);
  EXPECT_CONTAINS(error_of([&] { loader.restore(bin_state); }), "saved by a 'bin' loader");
  // The layout before sequences had a sample index: [micro-batches read].
  const uint64_t legacy[] = {5};
  EXPECT_EQ(error_of([&] { loader.restore(encode_loader_state(LoaderKind::copy, legacy)); }),
            "data-loader state: a copy-task state of one field (5 micro-batches read), saved by a "
            "moepeak that drew the copy task's sequences by (micro-batch, row); this build draws "
            "them by sample index, the same for any batch size and accumulation "
            "(docs/data.md#the-copy-task), so it cannot continue the sequences that run was "
            "reading: start the run again, or from its weights (moepeak export, then train "
            "--init-from)");
  const uint64_t other_seed[] = {3, 8};
  EXPECT_EQ(error_of([&] { loader.restore(encode_loader_state(LoaderKind::copy, other_seed)); }),
            "data-loader state: the checkpoint's copy task was drawn with job.seed = 8, but this "
            "run has job.seed = 0");
  const uint64_t past_range[] = {uint64_t{1} << 63, 0};
  EXPECT_CONTAINS(
      error_of([&] { loader.restore(encode_loader_state(LoaderKind::copy, past_range)); }),
      "sample index 9223372036854775808 is out of range");
  const uint64_t three[] = {0, 0, 0};
  EXPECT_CONTAINS(error_of([&] { loader.restore(encode_loader_state(LoaderKind::copy, three)); }),
                  "3 fields");
  next(loader);
  std::vector<uint8_t> after_one = loader.state();
  EXPECT_THROW(loader.restore(short_state), Error);
  EXPECT_THROW(loader.restore(encode_loader_state(LoaderKind::copy, legacy)), Error);
  EXPECT_THROW(loader.restore(encode_loader_state(LoaderKind::copy, other_seed)), Error);
  EXPECT_EQ(loader.state(), after_one) << "a failed restore leaves the loader as it was";
}

TEST(MakeDataLoader, DefaultIsTheCopyTask) {
  Config cfg;
  auto loader = make_data_loader(cfg.training, cfg.model, cfg.job.seed);
  EXPECT_EQ(loader->batch_size(), cfg.training.batch_size);
  EXPECT_EQ(loader->seq_len(), cfg.training.seq_len);
  EXPECT_CONTAINS(loader->describe(), "copy task");
  CopyTaskLoader direct(cfg.training.batch_size, cfg.training.seq_len, cfg.model.vocab_size,
                        cfg.job.seed);
  EXPECT_EQ(next(*loader), next(direct));
}

// ---- Token files ------------------------------------------------------------------------------

class TokenFileTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes: the file is exactly the concatenation of the parts.
  std::string write_bytes(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // A headerless nanoGPT file: the tokens as little-endian T, nothing else.
  template <typename T>
  std::string write_headerless(const std::string& name, const std::vector<int64_t>& tokens) {
    std::vector<uint8_t> bytes;
    for (int64_t t : tokens) append<T>(bytes, static_cast<T>(t));
    return write_bytes(name, bytes);
  }

  // llm.c's layout: int32 header[256] = {magic, version, token count, 0...}, then the tokens.
  template <typename T>
  std::string write_llmc(const std::string& name, const std::vector<int64_t>& tokens, int32_t magic,
                         int32_t version, int32_t count) {
    std::vector<uint8_t> bytes;
    append<int32_t>(bytes, magic);
    append<int32_t>(bytes, version);
    append<int32_t>(bytes, count);
    bytes.resize(1024, 0);
    for (int64_t t : tokens) append<T>(bytes, static_cast<T>(t));
    return write_bytes(name, bytes);
  }

  // Megatron's layout. <prefix>.idx: "MMIDIDX\0\0", uint64 version, uint8 dtype code, uint64
  // sequence count S, uint64 document count D, int32 lengths[S], int64 pointers[S] (bytes into
  // .bin), int64 document index[D]. <prefix>.bin: `bin_tokens` as T. Returns the prefix.
  struct MegatronIndex {
    std::vector<int32_t> lengths;
    std::vector<int64_t> pointers;
    std::vector<int64_t> documents;
    uint64_t version = 1;
    uint8_t dtype_code = 8;
  };
  static std::vector<uint8_t> megatron_idx_bytes(const MegatronIndex& idx) {
    std::vector<uint8_t> bytes = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    append<uint64_t>(bytes, idx.version);
    bytes.push_back(idx.dtype_code);
    append<uint64_t>(bytes, idx.lengths.size());
    append<uint64_t>(bytes, idx.documents.size());
    for (int32_t l : idx.lengths) append<int32_t>(bytes, l);
    for (int64_t p : idx.pointers) append<int64_t>(bytes, p);
    for (int64_t d : idx.documents) append<int64_t>(bytes, d);
    return bytes;
  }
  template <typename T>
  std::string write_megatron(const std::string& prefix, const MegatronIndex& idx,
                             const std::vector<int64_t>& bin_tokens) {
    write_bytes(prefix + ".idx", megatron_idx_bytes(idx));
    write_headerless<T>(prefix + ".bin", bin_tokens);
    return path(prefix);
  }
  // A contiguous index over sequences of the given lengths, one document per sequence.
  static MegatronIndex contiguous_index(const std::vector<int32_t>& lengths, size_t element) {
    MegatronIndex idx;
    idx.lengths = lengths;
    int64_t pointer = 0;
    idx.documents.push_back(0);
    for (size_t s = 0; s < lengths.size(); ++s) {
      idx.pointers.push_back(pointer);
      pointer += lengths[s] * static_cast<int64_t>(element);
      idx.documents.push_back(static_cast<int64_t>(s + 1));
    }
    return idx;
  }

  template <typename T>
  static void append(std::vector<uint8_t>& bytes, T value) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));  // the test host is little-endian, as the formats are
    bytes.insert(bytes.end(), raw, raw + sizeof(T));
  }

  static std::vector<int64_t> iota_tokens(int64_t n, int64_t first = 0) {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
    return t;
  }

  static TrainingConfig training(DatasetKind kind, const std::string& dataset_path,
                                 TokenDtype dtype, int64_t B, int64_t T) {
    TrainingConfig t;
    t.dataset = kind;
    t.dataset_path = dataset_path;
    t.token_dtype = dtype;
    t.batch_size = B;
    t.seq_len = T;
    t.shuffle = false;  // the file order these tests check; the shuffled order is tested below
    return t;
  }
  static ModelConfig model(int64_t vocab) {
    ModelConfig m;
    m.vocab_size = vocab;
    return m;
  }

  // Checks `steps` batches against the windowing rule over `stream`.
  static void expect_windows(DataLoader& loader, const std::vector<int64_t>& stream, int steps,
                             uint64_t first_cursor = 0) {
    const int64_t B = loader.batch_size(), T = loader.seq_len();
    const uint64_t N = stream.size();
    uint64_t cursor = first_cursor;
    for (int s = 0; s < steps; ++s) {
      Batch batch = next(loader);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) {
          const uint64_t at = cursor + static_cast<uint64_t>(b * T + t);
          ASSERT_EQ(batch.inputs[static_cast<size_t>(b * T + t)], stream[at % N])
              << "step " << s << " b " << b << " t " << t;
          ASSERT_EQ(batch.labels[static_cast<size_t>(b * T + t)], stream[(at + 1) % N])
              << "step " << s << " b " << b << " t " << t;
        }
      }
      cursor = (cursor + static_cast<uint64_t>(B * T)) % N;
    }
  }

  test_support::TempDir temp_{"moepeak_test_data"};
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(TokenFileTest, HeaderlessUint16WindowsAndWrap) {
  std::vector<int64_t> tokens = iota_tokens(50);
  std::string p = write_headerless<uint16_t>("train.bin", tokens);
  auto loader =
      make_data_loader(training(DatasetKind::bin, p, TokenDtype::uint16, 2, 8), model(100), 0);
  // Step 0, row 0 by hand: inputs 0..7, labels 1..8; row 1 starts at 8.
  Batch b0 = next(*loader);
  EXPECT_EQ(std::vector<int64_t>(b0.inputs.begin(), b0.inputs.begin() + 8), iota_tokens(8));
  EXPECT_EQ(std::vector<int64_t>(b0.labels.begin(), b0.labels.begin() + 8), iota_tokens(8, 1));
  EXPECT_EQ(b0.inputs[8], 8);
  // 16 tokens per step over 50: steps 3, 6, ... run past the end and continue at the start.
  auto again =
      make_data_loader(training(DatasetKind::bin, p, TokenDtype::uint16, 2, 8), model(100), 0);
  expect_windows(*again, tokens, 12);
  EXPECT_CONTAINS(loader->describe(), "50 tokens");
}

TEST_F(TokenFileTest, HeaderlessUint32) {
  std::vector<int64_t> tokens = iota_tokens(40, 70000);
  std::string p = write_headerless<uint32_t>("big.bin", tokens);
  auto loader =
      make_data_loader(training(DatasetKind::bin, p, TokenDtype::uint32, 3, 5), model(80000), 0);
  expect_windows(*loader, tokens, 10);
}

TEST_F(TokenFileTest, LlmcHeaderGpt2AndLlama3) {
  std::vector<int64_t> tokens = iota_tokens(33, 1);
  std::string p16 = write_llmc<uint16_t>("gpt2.bin", tokens, 20240520, 1, 33);
  auto l16 =
      make_data_loader(training(DatasetKind::bin, p16, TokenDtype::llmc, 2, 4), model(50257), 0);
  expect_windows(*l16, tokens, 9);
  EXPECT_CONTAINS(l16->describe(), "gpt-2");

  std::vector<int64_t> big = iota_tokens(21, 100000);
  std::string p32 = write_llmc<uint32_t>("llama.bin", big, 20240801, 7, 21);
  auto l32 =
      make_data_loader(training(DatasetKind::bin, p32, TokenDtype::llmc, 1, 20), model(128256), 0);
  expect_windows(*l32, big, 5);
}

TEST_F(TokenFileTest, StateRestoreResumesExactly) {
  std::vector<int64_t> tokens = iota_tokens(37);
  std::string p = write_headerless<uint16_t>("train.bin", tokens);
  TrainingConfig t = training(DatasetKind::bin, p, TokenDtype::uint16, 2, 6);
  auto run = make_data_loader(t, model(64), 0);
  for (int i = 0; i < 4; ++i) next(*run);
  std::vector<uint8_t> saved = run->state();
  std::vector<Batch> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(next(*run));

  auto resumed = make_data_loader(t, model(64), 0);
  resumed->restore(saved);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(next(*resumed), expected[static_cast<size_t>(i)]);

  // The state is "MPDL" v1, kind bin, 2 fields: token offset (4 * 12 mod 37 = 11) and count 37.
  ASSERT_EQ(saved.size(), 24u);
  EXPECT_EQ(saved[5], static_cast<uint8_t>(LoaderKind::bin));
  EXPECT_EQ(saved[8], 11);
  EXPECT_EQ(saved[16], 37);

  // A state for another dataset, a cursor past the end, or a copy-task state are refused.
  std::string other = write_headerless<uint16_t>("other.bin", iota_tokens(40));
  auto other_loader =
      make_data_loader(training(DatasetKind::bin, other, TokenDtype::uint16, 2, 6), model(64), 0);
  EXPECT_CONTAINS(error_of([&] { other_loader->restore(saved); }),
                  "saved for a dataset of 37 tokens, but " + other + " has 40");
  const uint64_t past_end[] = {37, 37};
  EXPECT_CONTAINS(
      error_of([&] { resumed->restore(encode_loader_state(LoaderKind::bin, past_end)); }),
      "token offset 37 is past the end");
  CopyTaskLoader copy(1, 4, 10, 0);
  EXPECT_CONTAINS(error_of([&] { resumed->restore(copy.state()); }), "saved by a 'copy' loader");
}

TEST_F(TokenFileTest, MegatronUint16AllPathSpellings) {
  // Sequences of 5, 0, 7, 20, 3 tokens; documents {0,1}, {2}, {3,4}.
  MegatronIndex idx = contiguous_index({5, 0, 7, 20, 3}, 2);
  idx.documents = {0, 2, 3, 5};
  std::vector<int64_t> tokens = iota_tokens(35, 10);
  std::string prefix = write_megatron<uint16_t>("corpus_text_document", idx, tokens);
  for (const std::string& spelling : {prefix, prefix + ".bin", prefix + ".idx"}) {
    SCOPED_TRACE(spelling);
    auto loader = make_data_loader(
        training(DatasetKind::megatron, spelling, TokenDtype::uint16, 2, 8), model(100), 0);
    expect_windows(*loader, tokens, 7);
    EXPECT_CONTAINS(loader->describe(), "3 documents");
  }
}

TEST_F(TokenFileTest, MegatronFollowsIndexOrderNotFileOrder) {
  // The .bin holds A = 0..9 then B = 100..105 (int32); the index lists B first, then A.
  std::vector<int64_t> bin = iota_tokens(10);
  for (int64_t v : iota_tokens(6, 100)) bin.push_back(v);
  MegatronIndex idx;
  idx.dtype_code = 4;  // int32
  idx.lengths = {6, 10};
  idx.pointers = {40, 0};
  idx.documents = {0, 1, 2};
  std::string prefix = write_megatron<int32_t>("shuffled", idx, bin);
  std::vector<int64_t> stream = iota_tokens(6, 100);
  for (int64_t v : iota_tokens(10)) stream.push_back(v);
  auto loader = make_data_loader(training(DatasetKind::megatron, prefix, TokenDtype::uint16, 1, 5),
                                 model(200), 0);
  expect_windows(*loader, stream, 8);

  auto resumed = make_data_loader(training(DatasetKind::megatron, prefix, TokenDtype::uint16, 1, 5),
                                  model(200), 0);
  for (int i = 0; i < 3; ++i) next(*resumed);
  auto fresh = make_data_loader(training(DatasetKind::megatron, prefix, TokenDtype::uint16, 1, 5),
                                model(200), 0);
  fresh->restore(resumed->state());
  EXPECT_EQ(next(*fresh), next(*resumed));
}

// ---- Errors: each names the file and, where there is one, the position -------------------------

TEST_F(TokenFileTest, MissingFiles) {
  std::string missing = path("nope.bin");
  EXPECT_CONTAINS(error_of([&] { open_token_bin(missing, TokenDtype::uint16); }),
                  missing + ": cannot open: No such file or directory");
  EXPECT_CONTAINS(error_of([&] { open_megatron_dataset(path("nope")); }),
                  path("nope.idx") + ": cannot open");
  write_bytes("only_idx.idx", megatron_idx_bytes(contiguous_index({4}, 2)));
  EXPECT_CONTAINS(error_of([&] { open_megatron_dataset(path("only_idx")); }),
                  path("only_idx.bin") + ": cannot open");
  TrainingConfig t = training(DatasetKind::bin, "", TokenDtype::uint16, 1, 4);
  EXPECT_CONTAINS(error_of([&] { make_data_loader(t, model(10), 0); }),
                  "training.dataset_path is required when training.dataset is bin");
}

TEST_F(TokenFileTest, HeaderlessSizeNotWholeTokens) {
  std::string p = write_bytes("odd.bin", std::vector<uint8_t>(101, 1));
  EXPECT_CONTAINS(error_of([&] { open_token_bin(p, TokenDtype::uint16); }),
                  p + ": size 101 bytes is not a whole number of uint16 tokens (2 bytes each)");
  std::string q = write_bytes("odd32.bin", std::vector<uint8_t>(102, 1));
  EXPECT_CONTAINS(error_of([&] { open_token_bin(q, TokenDtype::uint32); }), "uint32 tokens");
}

TEST_F(TokenFileTest, LlmcHeaderErrors) {
  std::string truncated = write_bytes("short.bin", std::vector<uint8_t>(100, 0));
  EXPECT_CONTAINS(error_of([&] { open_token_bin(truncated, TokenDtype::llmc); }),
                  truncated + ": truncated llm.c header: the file has 100 bytes");
  std::string magic = write_llmc<uint16_t>("magic.bin", iota_tokens(10), 12345, 1, 10);
  EXPECT_CONTAINS(error_of([&] { open_token_bin(magic, TokenDtype::llmc); }),
                  magic + ": bad llm.c magic 12345 at byte 0");
  std::string version = write_llmc<uint16_t>("version.bin", iota_tokens(10), 20240520, 3, 10);
  EXPECT_CONTAINS(error_of([&] { open_token_bin(version, TokenDtype::llmc); }),
                  version + ": unsupported llm.c version 3");
  std::string count = write_llmc<uint16_t>("count.bin", iota_tokens(10), 20240520, 1, 11);
  EXPECT_CONTAINS(error_of([&] { open_token_bin(count, TokenDtype::llmc); }),
                  count +
                      ": the header says 11 tokens (22 bytes after the 1024-byte header) "
                      "but the file has 20 bytes after the header");
  std::vector<uint8_t> ragged;
  append<int32_t>(ragged, 20240520);
  append<int32_t>(ragged, 1);
  append<int32_t>(ragged, 1);
  ragged.resize(1024 + 3, 0);
  std::string odd = write_bytes("ragged.bin", ragged);
  EXPECT_CONTAINS(
      error_of([&] { open_token_bin(odd, TokenDtype::llmc); }),
      odd + ": 3 bytes after the 1024-byte header are not a whole number of uint16 tokens");
}

TEST_F(TokenFileTest, TooFewTokens) {
  std::string p = write_headerless<uint16_t>("tiny.bin", iota_tokens(8));
  auto t = training(DatasetKind::bin, p, TokenDtype::uint16, 1, 8);
  EXPECT_CONTAINS(error_of([&] { make_data_loader(t, model(100), 0); }),
                  p + ": 8 tokens, fewer than training.seq_len + 1 = 9");
  t.seq_len = 7;  // exactly T + 1 tokens is enough
  EXPECT_NO_THROW(make_data_loader(t, model(100), 0));
  std::string empty = write_bytes("empty.bin", {});
  EXPECT_CONTAINS(error_of([&] {
                    make_data_loader(training(DatasetKind::bin, empty, TokenDtype::uint16, 1, 4),
                                     model(100), 0);
                  }),
                  empty + ": 0 tokens");
}

// The error of the batch whose window holds a bad id, after `good` batches that read fine: open
// does not scan the file, so the loader opens and the earlier batches run.
std::string error_at_batch(std::unique_ptr<DataLoader> loader, int good) {
  std::vector<int64_t> ids(static_cast<size_t>(loader->batch_size() * loader->seq_len()));
  std::vector<int64_t> labels(ids.size());
  for (int i = 0; i < good; ++i) {
    EXPECT_NO_THROW(loader->next_batch(ids.data(), labels.data())) << "batch " << i;
  }
  return error_of([&] { loader->next_batch(ids.data(), labels.data()); });
}

TEST_F(TokenFileTest, TokenIdOutOfVocabularyNamesFileOffsetAndByteWhenItsWindowIsRead) {
  std::vector<int64_t> tokens = iota_tokens(20);
  tokens[3] = 70000;
  std::string p = write_headerless<uint32_t>("train.bin", tokens);
  EXPECT_EQ(error_at_batch(make_data_loader(training(DatasetKind::bin, p, TokenDtype::uint32, 1, 4),
                                            model(50257), 0),
                           0),
            p + ": token 70000 at offset 3 (byte 12) is >= model.vocab_size 50257");

  // Windows of 4 + 1 tokens from 0, 4, 8, 12: the fifth (16..20) is the first to read token 17.
  std::vector<int64_t> small = iota_tokens(20);
  small[17] = 300;
  std::string q = write_llmc<uint16_t>("llmc.bin", small, 20240520, 1, 20);
  EXPECT_EQ(error_at_batch(make_data_loader(training(DatasetKind::bin, q, TokenDtype::llmc, 1, 4),
                                            model(256), 0),
                           4),
            q + ": token 300 at offset 17 (byte 1058) is >= model.vocab_size 256");

  // Megatron: offsets count tokens of the .bin; a negative id in an int32 dataset, read by the
  // third window (8..12).
  std::vector<int64_t> m = iota_tokens(12);
  m[9] = -5;
  std::string prefix = write_megatron<int32_t>(
      "neg",
      [] {
        MegatronIndex idx = contiguous_index({4, 8}, 4);
        idx.dtype_code = 4;
        return idx;
      }(),
      m);
  EXPECT_EQ(error_at_batch(
                make_data_loader(training(DatasetKind::megatron, prefix, TokenDtype::uint16, 1, 4),
                                 model(256), 0),
                2),
            prefix + ".bin: token -5 at offset 9 (byte 36) is negative");
}

TEST_F(TokenFileTest, MegatronIndexErrors) {
  const std::vector<int64_t> tokens = iota_tokens(12);
  const MegatronIndex good = contiguous_index({4, 8}, 2);
  auto open_with = [&](const std::string& name, const std::vector<uint8_t>& idx_bytes) {
    write_bytes(name + ".idx", idx_bytes);
    write_headerless<uint16_t>(name + ".bin", tokens);
    std::string prefix = path(name);
    return error_of([&] { open_megatron_dataset(prefix); });
  };
  std::vector<uint8_t> bytes = megatron_idx_bytes(good);

  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + 20);
  EXPECT_CONTAINS(open_with("cut", cut),
                  path("cut.idx") + ": truncated index header: the file has 20 bytes");

  std::vector<uint8_t> magic = bytes;
  magic[0] = 'X';
  EXPECT_CONTAINS(open_with("magic", magic), path("magic.idx") + ": bad magic at byte 0");

  MegatronIndex v2 = good;
  v2.version = 2;
  EXPECT_CONTAINS(open_with("version", megatron_idx_bytes(v2)),
                  path("version.idx") + ": unsupported index version 2 (byte 9");

  MegatronIndex f32 = good;
  f32.dtype_code = 7;
  EXPECT_CONTAINS(open_with("float", megatron_idx_bytes(f32)),
                  path("float.idx") + ": dtype code 7");
  MegatronIndex unknown = good;
  unknown.dtype_code = 42;
  EXPECT_CONTAINS(open_with("unknown", megatron_idx_bytes(unknown)),
                  path("unknown.idx") + ": unknown dtype code 42");

  std::vector<uint8_t> short_arrays(bytes.begin(), bytes.end() - 4);
  EXPECT_CONTAINS(open_with("arrays", short_arrays),
                  path("arrays.idx") + ": truncated index: 2 sequences and 3 documents");

  MegatronIndex past = good;
  past.lengths[1] = 9;  // 4 + 9 tokens > the 12 in the .bin
  EXPECT_CONTAINS(open_with("past", megatron_idx_bytes(past)),
                  path("past.idx") + ": sequence 1 (9 tokens at byte 8) runs past the end of " +
                      path("past.bin"));

  MegatronIndex docs = good;
  docs.documents = {0, 1};
  EXPECT_CONTAINS(
      open_with("docs", megatron_idx_bytes(docs)),
      path("docs.idx") + ": the document index ends at 1, expected the sequence count 2");

  MegatronIndex pointer = good;
  pointer.pointers[1] = 7;
  EXPECT_CONTAINS(open_with("pointer", megatron_idx_bytes(pointer)),
                  path("pointer.idx") + ": sequence 1 has pointer 7");

  write_bytes("ragged.idx", bytes);
  write_bytes("ragged.bin", std::vector<uint8_t>(25, 0));
  EXPECT_CONTAINS(error_of([&] { open_megatron_dataset(path("ragged")); }),
                  path("ragged.bin") + ": size 25 bytes is not a whole number of uint16 tokens");
}

}  // namespace
}  // namespace moepeak
