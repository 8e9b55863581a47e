// Tests of the sharded checkpoint's file layer (core/checkpoint/shard_manifest.h, shard_io.h,
// checksum.h): XXH3 one-shot against streaming and a published value; the writer's aligned
// offsets, bounded buffer and block checksums against a rehash of the file; the manifest's JSON
// round trip and every validation rule; the reader against the source bytes for every element
// range of a tensor cut over three files; and corruption: a flipped byte, a truncated or missing
// file, each an error naming the file (and the tensor), with untouched blocks still readable.
//     ctest -R test_shard_checkpoint --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/checkpoint/checksum.h"
#include "core/checkpoint/shard_io.h"
#include "core/checkpoint/shard_manifest.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::TempDir;

// Every needle occurs in the error message (an error names its file, tensor and numbers).
void expect_all(const std::string& message, const std::vector<std::string>& needles,
                const char* file, int line) {
  for (const std::string& needle : needles) {
    test_support::expect_contains(message, needle, file, line);
  }
}
#define EXPECT_CONTAINS_ALL(message, ...) expect_all((message), __VA_ARGS__, __FILE__, __LINE__)

using test_support::error_of;

std::vector<char> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Checksum, StreamingEqualsOneShotAndTheEmptyInputHasItsPublishedValue) {
  EXPECT_EQ(xxh3_64(nullptr, 0), 0x2D06800538D394C2ull);  // XXH3_64bits("") from xxHash's docs
  std::vector<char> bytes(100'003);
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  const uint64_t whole = xxh3_64(bytes.data(), bytes.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{239}, size_t{4096}, size_t{99'999}}) {
    Xxh3Stream s;
    s.update(bytes.data(), split);
    s.update(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(s.digest(), whole) << "split at " << split;
  }
  EXPECT_EQ(checksum_hex(0x00ab), "00000000000000ab");
  EXPECT_EQ(parse_checksum_hex(checksum_hex(whole)), whole);
  EXPECT_FALSE(parse_checksum_hex("12345"));
  EXPECT_FALSE(parse_checksum_hex("zz00000000000000"));
}

// A tensor of n floats cut in `files` contiguous shards of ceil(n / files) elements (ZeRO-3's
// rule), each written by its own writer with a 4096-byte buffer; plus a small second tensor in
// file 0 behind the first one's shard.
struct ShardedFixture {
  TempDir dir{"moepeak_shard"};
  ShardManifest manifest;
  std::vector<float> big = random_floats(10'000, 1);
  std::vector<float> small = random_floats(37, 2);

  explicit ShardedFixture(int files = 3, uint64_t block_bytes = 1000) {
    manifest.block_bytes = block_bytes;
    manifest.metadata = {{"step", 12}};
    ShardTensor t{"model.embed_tokens.weight", DType::f32, {100, 100}, {}};
    ShardTensor s{"model.norm.weight", DType::f32, {37}, {}};
    const int64_t n = t.numel(), shard = (n + files - 1) / files;
    for (int f = 0; f < files; ++f) {
      const std::string name = "shard-0000" + std::to_string(f) + ".bin";
      ShardFileWriter w((dir.path() / name).string(), 4096, block_bytes);
      EXPECT_EQ(w.buffer_bytes(), 4096u);
      const int64_t lo = f * shard, hi = std::min(n, lo + shard);
      const uint64_t at = w.append(big.data() + lo, static_cast<size_t>(hi - lo) * 4);
      t.slices.push_back({f, at, lo, hi});
      if (f == 0) {
        const uint64_t at_small = w.append(small.data(), small.size() * 4);
        EXPECT_EQ(at_small % kShardAlignBytes, 0u);
        s.slices.push_back({0, at_small, 0, 37});
      }
      manifest.files.push_back(w.finish());
    }
    manifest.tensors = {t, s};
    manifest.validate("fixture");
  }
  std::filesystem::path file(int f) const { return dir.path() / manifest.files[f].name; }
};

TEST(ShardFileWriter, BlockChecksumsMatchTheFileAndEverySliceStartsABlock) {
  ShardedFixture fx;
  for (size_t f = 0; f < fx.manifest.files.size(); ++f) {
    const ShardFileInfo& info = fx.manifest.files[f];
    const std::vector<char> bytes = file_bytes(fx.file(static_cast<int>(f)));
    ASSERT_EQ(bytes.size(), info.bytes);
    std::vector<uint64_t> starts;
    uint64_t lo = 0;
    for (const ShardBlock& b : info.blocks) {
      EXPECT_LE(b.bytes, fx.manifest.block_bytes);
      EXPECT_EQ(b.xxh3, xxh3_64(bytes.data() + lo, b.bytes)) << info.name << " at " << lo;
      starts.push_back(lo);
      lo += b.bytes;
    }
    EXPECT_EQ(lo, info.bytes);
    for (const ShardTensor& t : fx.manifest.tensors) {
      for (const ShardSlice& s : t.slices) {
        if (s.file != static_cast<int>(f)) continue;
        EXPECT_TRUE(std::find(starts.begin(), starts.end(), s.offset) != starts.end())
            << t.name << "'s slice at " << s.offset << " does not start a block";
      }
    }
  }
  // File 0: 3334 floats (13,336 bytes: 13 blocks of 1000 and one of 336 + 40 bytes of padding
  // to 13,376), then the 37 floats in a block of their own.
  EXPECT_EQ(fx.manifest.tensors[1].slices[0].offset, 13'376u);
  EXPECT_EQ(fx.manifest.files[0].bytes, 13'376u + 37 * 4);
  ASSERT_EQ(fx.manifest.files[0].blocks.size(), 15u);
  EXPECT_EQ(fx.manifest.files[0].blocks[13].bytes, 376u);
  EXPECT_EQ(fx.manifest.files[0].blocks[14].bytes, 148u);
}

TEST(ShardFileWriter, AnUnfinishedFileIsRemoved) {
  TempDir dir;
  const auto path = dir.path() / "shard-00000.bin";
  {
    ShardFileWriter w(path.string(), 4096, 1 << 20);
    std::vector<char> data(10'000, 'x');
    w.append(data.data(), data.size());
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "a save that failed left its file behind";
  ShardFileWriter first(path.string(), 4096, 1 << 20);
  first.finish();
  EXPECT_CONTAINS_ALL(error_of([&] { ShardFileWriter again(path.string(), 4096, 1 << 20); }),
                      {path.string(), "File exists"});
}

TEST(ShardManifest, JsonRoundTripKeepsEveryField) {
  ShardedFixture fx;
  const ShardManifest back = ShardManifest::parse(fx.manifest.to_json(), "manifest.json");
  EXPECT_EQ(back.block_bytes, fx.manifest.block_bytes);
  EXPECT_EQ(back.metadata, fx.manifest.metadata);
  ASSERT_EQ(back.files.size(), 3u);
  for (size_t f = 0; f < 3; ++f) {
    EXPECT_EQ(back.files[f].name, fx.manifest.files[f].name);
    EXPECT_EQ(back.files[f].bytes, fx.manifest.files[f].bytes);
    EXPECT_EQ(back.files[f].blocks, fx.manifest.files[f].blocks);
  }
  ASSERT_EQ(back.tensors.size(), 2u);
  const ShardTensor& t = back.tensor("model.embed_tokens.weight", "test");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{100, 100}));
  EXPECT_EQ(t.dtype, DType::f32);
  ASSERT_EQ(t.slices.size(), 3u);
  EXPECT_EQ(t.slices[2].begin, 6668);
  EXPECT_EQ(t.slices[2].end, 10'000);
  EXPECT_CONTAINS_ALL(error_of([&] { back.tensor("lm_head.weight", "ckpt/step_3"); }),
                      {"ckpt/step_3", "no tensor 'lm_head.weight'"});
}

TEST(ShardManifest, EveryRuleIsCheckedWithTheTensorOrFileNamed) {
  ShardedFixture fx;
  auto broken = [&](auto&& change) {
    ShardManifest m = fx.manifest;
    change(m);
    return error_of([&] { ShardManifest::parse(m.to_json(), "ck/manifest.json"); });
  };
  const std::string emb = "tensor 'model.embed_tokens.weight'";
  EXPECT_CONTAINS_ALL(
      broken([](ShardManifest& m) { m.tensors[0].slices.erase(m.tensors[0].slices.begin() + 1); }),
      {"ck/manifest.json", emb, "elements [3334, 6668)", "does not cover"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[0].slices.pop_back(); }),
                      {emb, "elements [6668, 10000)", "does not cover"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[0].slices[1].begin -= 4; }),
                      {emb, "overlap"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[0].slices[0].file = 7; }),
                      {emb, "file index 7 of 3"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[1].slices[0].offset += 2; }),
                      {"tensor 'model.norm.weight'", "not aligned"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[1].slices[0].offset += 64; }),
                      {"tensor 'model.norm.weight'", "runs past", "shard-00000.bin"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.files[1].blocks.pop_back(); }),
                      {"shard-00001.bin", "cover"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.files[1].name = "../x.bin"; }),
                      {"not a plain name"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.files[2].name = m.files[0].name; }),
                      {"shard-00000.bin", "twice"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[1].name = m.tensors[0].name; }),
                      {emb, "twice"});
  EXPECT_CONTAINS_ALL(broken([](ShardManifest& m) { m.tensors[1].shape = {38}; }),
                      {"tensor 'model.norm.weight'", "elements [37, 38)"});
  EXPECT_CONTAINS_ALL(error_of([] { ShardManifest::parse("{\"format\": \"x\"}", "m.json"); }),
                      {"m.json", "format \"x\""});
  EXPECT_CONTAINS_ALL(error_of([] {
                        ShardManifest::parse(
                            "{\"format\": \"moepeak-sharded-checkpoint\", \"version\": 9}",
                            "m.json");
                      }),
                      {"m.json", "version 9"});
  EXPECT_CONTAINS_ALL(error_of([] { ShardManifest::parse("{\"format\": ", "m.json"); }),
                      {"m.json", "not valid JSON"});
  EXPECT_CONTAINS_ALL(error_of([] {
                        ShardManifest::parse(
                            "{\"format\": \"moepeak-sharded-checkpoint\", \"version\": 1, "
                            "\"block_bytes\": 8, \"files\": []}",
                            "m.json");
                      }),
                      {"m.json", "\"tensors\" is missing"});
}

TEST(ShardReader, EveryElementRangeReadsTheSourceBytes) {
  ShardedFixture fx;
  ShardReader reader(fx.dir.path().string(), fx.manifest);
  const ShardTensor& t = fx.manifest.tensors[0];
  // Ranges inside one shard, across one boundary, across both, the whole tensor, empty.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 1},      {0, 3334},      {3333, 3335}, {100, 9000}, {6667, 6669},
      {0, 10'000}, {9999, 10'000}, {5000, 5000}, {3334, 6668}};
  for (auto [lo, hi] : ranges) {
    std::vector<float> got(static_cast<size_t>(hi - lo) + 1, -1.0f);
    reader.read(t, lo, hi, got.data());
    for (int64_t i = lo; i < hi; ++i) {
      ASSERT_EQ(got[static_cast<size_t>(i - lo)], fx.big[static_cast<size_t>(i)])
          << "element " << i << " of [" << lo << ", " << hi << ")";
    }
    EXPECT_EQ(got.back(), -1.0f) << "read past [" << lo << ", " << hi << ")";
  }
  std::vector<float> small(37);
  reader.read(fx.manifest.tensors[1], 0, 37, small.data());
  EXPECT_EQ(small, fx.small);
  EXPECT_CONTAINS_ALL(error_of([&] { reader.read(t, 9000, 10'001, small.data()); }),
                      {"model.embed_tokens.weight", "outside its 10000"});
}

TEST(ShardReader, OnlyTheBlocksReadAreVerified) {
  ShardedFixture fx;
  ShardReader reader(fx.dir.path().string(), fx.manifest);
  std::vector<float> got(10);
  reader.read(fx.manifest.tensors[0], 10, 20, got.data());  // bytes [40, 80) of file 0: block 0
  EXPECT_EQ(reader.blocks_verified(), 1u);
  reader.read(fx.manifest.tensors[0], 10, 20, got.data());
  EXPECT_EQ(reader.blocks_verified(), 1u) << "a verified block is not hashed again";
  reader.read(fx.manifest.tensors[0], 245, 255, got.data());  // bytes [980, 1020): blocks 0, 1
  EXPECT_EQ(reader.blocks_verified(), 2u);
}

TEST(ShardReader, AFlippedByteFailsTheReadsOfItsBlockNamingFileBlockAndTensor) {
  ShardedFixture fx;
  {
    std::fstream f(fx.file(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2500);  // block 2 of file 1: elements 3334 + 625 .. of the embedding
    char c;
    f.read(&c, 1);
    f.seekp(2500);
    c = static_cast<char>(c ^ 0x10);  // a small change to one float, not a NaN
    f.write(&c, 1);
  }
  ShardReader reader(fx.dir.path().string(), fx.manifest);
  std::vector<float> got(10);
  EXPECT_CONTAINS_ALL(
      error_of([&] { reader.read(fx.manifest.tensors[0], 3334 + 620, 3334 + 630, got.data()); }),
      {"shard-00001.bin", "bytes [2000, 3000) (block 2)", "fail their checksum",
       "tensor 'model.embed_tokens.weight'", "corrupt"});
  reader.read(fx.manifest.tensors[0], 3334, 3344, got.data());  // block 0 of the same file
  EXPECT_EQ(got[0], fx.big[3334]);
}

TEST(ShardReader, AFailedBlockNamesTheTensorWhoseBytesChanged) {
  // The small tensor shares file 0 with a shard of the big one; a byte of the small one flipped
  // fails only its reads, and names it.
  ShardedFixture fx;
  {
    std::fstream f(fx.file(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(13'376 + 41);
    const char c = 0x5a;
    f.write(&c, 1);
  }
  ShardReader reader(fx.dir.path().string(), fx.manifest);
  std::vector<float> big(10'000), small(37);
  reader.read(fx.manifest.tensors[0], 0, 10'000, big.data());
  EXPECT_EQ(big, fx.big);
  EXPECT_CONTAINS_ALL(
      error_of([&] { reader.read(fx.manifest.tensors[1], 0, 37, small.data()); }),
      {"shard-00000.bin", "bytes [13376, 13524) (block 14)", "tensor 'model.norm.weight'"});
}

TEST(ShardReader, TruncatedAndMissingFilesAreErrorsNamingThem) {
  ShardedFixture fx;
  std::filesystem::resize_file(fx.file(2), fx.manifest.files[2].bytes - 4);
  std::filesystem::remove(fx.file(1));
  ShardReader reader(fx.dir.path().string(), fx.manifest);
  std::vector<float> got(10);
  EXPECT_CONTAINS_ALL(
      error_of([&] { reader.read(fx.manifest.tensors[0], 9990, 10'000, got.data()); }),
      {"shard-00002.bin", "truncated", "tensor 'model.embed_tokens.weight'"});
  EXPECT_CONTAINS_ALL(
      error_of([&] { reader.read(fx.manifest.tensors[0], 4000, 4010, got.data()); }),
      {"shard-00001.bin", "cannot open", "tensor 'model.embed_tokens.weight'"});
  reader.read(fx.manifest.tensors[1], 0, 10, got.data());  // file 0 is whole
  EXPECT_EQ(got[9], fx.small[9]);
}

TEST(PlanRead, PiecesFollowTheSlices) {
  ShardedFixture fx;
  const std::vector<ShardReadPiece> pieces = plan_read(fx.manifest.tensors[0], 3000, 7000);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].file, 0);
  EXPECT_EQ(pieces[0].offset, 3000u * 4);
  EXPECT_EQ(pieces[0].bytes, 334u * 4);
  EXPECT_EQ(pieces[1].dest_element, 334);
  EXPECT_EQ(pieces[1].bytes, 3334u * 4);
  EXPECT_EQ(pieces[2].offset, 0u);
  EXPECT_EQ(pieces[2].bytes, 332u * 4);
  EXPECT_TRUE(plan_read(fx.manifest.tensors[0], 50, 50).empty());
}

}  // namespace
}  // namespace moepeak
