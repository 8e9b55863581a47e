// The two ends of `moepeak data prepare` without a tokenizer: MegatronWriter's .bin/.idx read back
// by open_megatron_dataset (uint16 and int32, documents in order, the type chosen from the
// vocabulary size as Megatron does), nothing in place before commit() and an old dataset kept
// when a writer is abandoned, an id that does not fit refused; and DocumentReader's documents of
// text (blank-line separated) and JSONL files, in order, in bounded chunks, with its errors
// naming file and line. The tokenizer pipeline is tests/cli/test_data_prepare.sh.
// Run: ctest -R test_prepare_io
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/megatron_writer.h"
#include "core/data/token_dataset.h"
#include "core/error.h"
#include "core/prepare/document_reader.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::error_of;

std::vector<int64_t> all_tokens(const TokenDataset& d) {
  std::vector<int64_t> out(d.token_count());
  d.read_cyclic(0, d.token_count(), out.data(), int64_t{1} << 40);
  return out;
}

TEST(MegatronWriter, WhatItWritesReadsBackInOrder) {
  test_support::TempDir dir;
  for (TokenStorage storage : {TokenStorage::u16, TokenStorage::i32}) {
    SCOPED_TRACE(std::string(token_storage_name(storage)));
    const std::string prefix = (dir.path() / std::string(token_storage_name(storage))).string();
    const std::vector<std::vector<int32_t>> docs = {{5, 6, 7}, {1}, {60000, 2, 2, 9}};
    {
      MegatronWriter out(prefix, storage);
      for (const auto& d : docs) out.add_document(d);
      EXPECT_EQ(out.documents(), 3u);
      EXPECT_EQ(out.tokens(), 8u);
      out.commit();
    }
    const TokenDataset read = open_megatron_dataset(prefix);
    EXPECT_EQ(read.storage(), storage);
    EXPECT_EQ(all_tokens(read), (std::vector<int64_t>{5, 6, 7, 1, 60000, 2, 2, 9}));
    EXPECT_CONTAINS(read.format(), "3 documents");
    for (const auto& entry : fs::directory_iterator(dir.path()))
      EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(megatron_token_storage(32000), TokenStorage::u16);  // Mixtral's vocabulary
  EXPECT_EQ(megatron_token_storage(65499), TokenStorage::u16);
  EXPECT_EQ(megatron_token_storage(65500), TokenStorage::i32);
  EXPECT_EQ(megatron_token_storage(128256), TokenStorage::i32);  // Llama 3's
}

TEST(MegatronWriter, NothingIsInPlaceBeforeCommitAndAnAbandonedWriterKeepsTheOldFiles) {
  test_support::TempDir dir;
  const std::string prefix = (dir.path() / "ds").string();
  {
    MegatronWriter first(prefix, TokenStorage::u16);
    first.add_document(std::vector<int32_t>{1, 2, 3});
    EXPECT_FALSE(fs::exists(prefix + ".bin"));
    EXPECT_FALSE(fs::exists(prefix + ".idx"));
    first.commit();
  }
  {
    MegatronWriter second(prefix, TokenStorage::u16);
    second.add_document(std::vector<int32_t>{9, 9});
    EXPECT_CONTAINS(error_of([&] { second.add_document(std::vector<int32_t>{70000}); }),
                    "document 1 has token id 70000, which does not fit uint16");
  }  // abandoned: no commit
  EXPECT_EQ(all_tokens(open_megatron_dataset(prefix)), (std::vector<int64_t>{1, 2, 3}));
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 2u) << "no temporary file left behind";
  EXPECT_CONTAINS(error_of([&] {
                    MegatronWriter bad((dir.path() / "no/such/dir/ds").string(), TokenStorage::u16);
                  }),
                  "no/such/dir/ds.bin: cannot create it");
}

class Documents : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (temp_.path() / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  static std::vector<std::string> all(DocumentReader& reader, size_t chunk) {
    std::vector<std::string> out;
    size_t calls = 0;
    while (reader.read(out, chunk)) ++calls;
    EXPECT_GE(calls, 1u);
    return out;
  }
  test_support::TempDir temp_{"moepeak_test_prepare"};
};

TEST_F(Documents, TextAndJsonlInOrderInAnyChunkSize) {
  const std::string text = write("a.txt", "first line\nsecond line\n\n\n  \nnext doc\r\n\nlast");
  const std::string jsonl = write(
      "b.jsonl",
      "{\"text\": \"json one\", \"id\": 1}\n\n{\"text\": \"\"}\n{\"text\": \"two\\nlines\"}\n");
  const std::vector<std::string> expected = {"first line\nsecond line", "next doc", "last",
                                             "json one", "two\nlines"};
  for (size_t chunk : {size_t{1}, size_t{10}, size_t{1} << 20}) {
    DocumentReader reader({text, jsonl}, InputFormat::automatic);
    EXPECT_EQ(all(reader, chunk), expected) << "chunk " << chunk;
    EXPECT_EQ(reader.skipped_empty(), 1u);
    EXPECT_EQ(reader.bytes_read(), reader.total_bytes());
  }
  // A forced format: the .txt read as JSONL fails on its first line.
  DocumentReader forced({text}, InputFormat::jsonl);
  EXPECT_CONTAINS(error_of([&] { all(forced, 100); }), text + ":1: not a JSON line");
}

TEST_F(Documents, BadJsonlLinesAndMissingFilesAreNamed) {
  const std::string p = write("bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
  DocumentReader no_field({p}, InputFormat::automatic);
  EXPECT_CONTAINS(error_of([&] { all(no_field, 100); }), p + ":2: no \"text\" field");
  DocumentReader other_key({p}, InputFormat::automatic, "body");
  EXPECT_CONTAINS(error_of([&] { all(other_key, 100); }), p + ":1: no \"body\" field");
  const std::string q = write("num.jsonl", "{\"text\": 5}\n[1, 2]\n");
  DocumentReader not_string({q}, InputFormat::automatic);
  EXPECT_CONTAINS(error_of([&] { all(not_string, 100); }), q + ":1: \"text\" is not a string");
  const std::string r = write("array.jsonl", "[1, 2]\n");
  DocumentReader not_object({r}, InputFormat::automatic);
  EXPECT_CONTAINS(error_of([&] { all(not_object, 100); }), r + ":1: not a JSON object");
  const std::string missing = (temp_.path() / "missing.txt").string();
  EXPECT_CONTAINS(error_of([&] {
                    DocumentReader({p, missing}, InputFormat::automatic);
                  }),
                  missing + ": no such input file");
}

}  // namespace
}  // namespace moepeak
