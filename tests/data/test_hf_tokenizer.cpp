// tokenizer.json encoding (core/prepare/hf_tokenizer.h) against Hugging Face tokenizers' own ids.
//
// The fixtures (tests/data/tokenizers/<kind>/tokenizer.json and cases.jsonl) were generated once,
// outside the repo and CI, with the Python package tokenizers 0.23.3: a script trains a small
// BPE tokenizer of each kind on a multilingual corpus it makes up, gives it the normalizer,
// pre-tokenizer, post-processor and added tokens of the model it mirrors, and writes each case's
// tok.encode(text).ids ("ids", with the post-processor's special tokens) and
// tok.encode(text, add_special_tokens=False).ids ("ids_no_special"). The kinds mirror Qwen3
// (NFC, Qwen2's Split regex, ByteLevel), gpt-oss (o200k's Split regex, ByteLevel, ignore_merges),
// DeepSeek-V3 (three Splits, ByteLevel, a BOS template), GPT-2 (ByteLevel with its own regex and
// add_prefix_space; merges in the old "a b" form) and Llama/Mistral's Metaspace (NFKC, Digits,
// Metaspace, byte_fallback, unk, a BOS template, added tokens with lstrip / rstrip / single_word /
// normalized). Seven variants (tokenizers itself encoding the same texts) swap in the parts those
// do not use: Split with a literal pattern, every behavior and invert; NFD, NFKD, Replace
// (literal and regex) and Prepend normalizers; Digits runs; Metaspace always / never / unsplit;
// no byte fallback, so unknown characters become <unk> (fused or not) or, without unk_token,
// are dropped.
// The cases: ASCII, Latin with precomposed and decomposed diacritics, Greek,
// Cyrillic, Arabic, CJK, kana (half-width too), Korean, emoji (ZWJ, flags, skin tones),
// combining marks, ligatures and full-width forms, runs of spaces, tabs and newlines, digits,
// contractions, every added token inside text (and another kind's, which must not match), the
// empty text, characters the training never saw.
//
// Also: encoding on two threads at once gives the same ids; every field the implementation does
// not have is an error naming it; a model directory's tokenizer and EOS are found as
// tokenizer.h says.
// Run: ./build/tests/data/test_hf_tokenizer
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/prepare/hf_tokenizer.h"
#include "core/prepare/tokenizer.h"
#include "tests/expect_contains.h"
#include "tests/source_dir.h"

namespace moepeak {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(test_support::source_dir()) / "tests/data/tokenizers";

struct Case {
  std::string name, text;
  std::vector<int32_t> ids, ids_no_special;
};

std::vector<Case> read_cases(const std::string& kind) {
  std::ifstream in(kFixtures / kind / "cases.jsonl");
  EXPECT_TRUE(in) << kind;
  std::vector<Case> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    cases.push_back({j.at("name").get<std::string>(), j.at("text").get<std::string>(),
                     j.at("ids").get<std::vector<int32_t>>(),
                     j.at("ids_no_special").get<std::vector<int32_t>>()});
  }
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

class HfTokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerFixture, EncodesAsHuggingFaceTokenizers) {
  const std::string kind = GetParam();
  const hf::Tokenizer tok((kFixtures / kind / "tokenizer.json").string());
  const std::vector<Case> cases = read_cases(kind);
  ASSERT_GE(cases.size(), 30u);
  int exact = 0;
  for (const Case& c : cases) {
    std::vector<int32_t> with, without;
    tok.encode(c.text, with, true);
    tok.encode(c.text, without, false);
    EXPECT_EQ(with, c.ids) << kind << " / " << c.name << ": got " << show(with) << ", want "
                           << show(c.ids);
    EXPECT_EQ(without, c.ids_no_special) << kind << " / " << c.name;
    exact += with == c.ids && without == c.ids_no_special;
  }
  std::printf("%s: %d of %zu cases exact\n", kind.c_str(), exact, cases.size());
}

// The same ids from two threads encoding at once (each keeps its own word cache and match data).
TEST_P(HfTokenizerFixture, TwoThreadsAgree) {
  const std::string kind = GetParam();
  const hf::Tokenizer tok((kFixtures / kind / "tokenizer.json").string());
  const std::vector<Case> cases = read_cases(kind);
  std::vector<std::vector<int32_t>> got[2];
  auto run = [&](int t) {
    for (int round = 0; round < 3; ++round) {
      got[t].assign(cases.size(), {});
      for (size_t i = 0; i < cases.size(); ++i)
        tok.encode(cases[(i + t) % cases.size()].text, got[t][i]);
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[0][(i + cases.size() - 0) % cases.size()], cases[i].ids) << cases[i].name;
    EXPECT_EQ(got[1][(i + cases.size() - 1) % cases.size()], cases[i].ids) << cases[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfTokenizerFixture,
                         ::testing::Values("qwen3", "gpt_oss", "deepseek_v3", "gpt2", "metaspace",
                                           "split_behaviors", "normalizer_edits",
                                           "metaspace_always", "metaspace_never_unsplit",
                                           "metaspace_unk_fused", "metaspace_unk_unfused",
                                           "metaspace_no_unk"));

// A scratch directory per test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("moepeak_hf_tok_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

// The gpt2 fixture's tokenizer.json with `edit` applied, written to `dir`.
std::string edited(const TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(kFixtures / "gpt2" / "tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  dir.write("tokenizer.json", j.dump());
  return (dir.path / "tokenizer.json").string();
}

std::string error_of(const std::string& path) {
  return test_support::error_of([&] { hf::Tokenizer t(path); });
}

TEST(HfTokenizerErrors, NameTheFieldTheyCannotTake) {
  TempDir dir("errors");
  using J = nlohmann::json;
  EXPECT_CONTAINS(
      error_of(edited(dir,
                      [](J& j) {
                        j["normalizer"] = {{"type", "BertNormalizer"}};
                      })),
      "field \"normalizer.type\" is \"BertNormalizer\", which moepeak does not implement");
  EXPECT_CONTAINS(error_of(edited(dir,
                                  [](J& j) {
                                    j["pre_tokenizer"] = {
                                        {"type", "Sequence"},
                                        {"pretokenizers",
                                         J::array({j["pre_tokenizer"], {{"type", "Whitespace"}}})}};
                                  })),
                  "field \"pre_tokenizer.pretokenizers[1].type\" is \"Whitespace\"");
  EXPECT_CONTAINS(error_of(edited(dir, [](J& j) { j["model"]["type"] = "WordPiece"; })),
                  "field \"model.type\" is \"WordPiece\"");
  EXPECT_CONTAINS(error_of(edited(dir, [](J& j) { j["model"]["dropout"] = 0.1; })),
                  "field \"model.dropout\" is set");
  EXPECT_CONTAINS(error_of(edited(dir,
                                  [](J& j) {
                                    j["truncation"] = {{"max_length", 8}};
                                  })),
                  "field \"truncation\" is set");
  EXPECT_CONTAINS(error_of(edited(dir,
                                  [](J& j) {
                                    j["post_processor"] = {{"type", "RobertaProcessing"}};
                                  })),
                  "field \"post_processor.type\" is \"RobertaProcessing\"");
  EXPECT_CONTAINS(
      error_of(edited(dir, [](J& j) { j["model"]["merges"][0] = "zz qq"; })),
      "field \"model.merges[0]\" merges \"zz\" and \"qq\", but \"zz\" is not in the vocab");
  EXPECT_CONTAINS(error_of(edited(dir,
                                  [](J& j) {
                                    j["pre_tokenizer"] = {{"type", "Split"},
                                                          {"pattern", {{"Regex", "(\\p{L}"}}},
                                                          {"behavior", "Isolated"}};
                                  })),
                  "does not compile at offset");
  EXPECT_CONTAINS(error_of(edited(dir,
                                  [](J& j) {
                                    j["pre_tokenizer"] = {{"type", "Split"},
                                                          {"pattern", {{"String", " "}}},
                                                          {"behavior", "Sideways"}};
                                  })),
                  "field \"pre_tokenizer.behavior\" is \"Sideways\"");
  // Sequences nested 100 deep: refused with the field, not a stack overflow.
  EXPECT_CONTAINS(
      error_of(edited(dir,
                      [](J& j) {
                        J inner = {{"type", "NFC"}};
                        for (int i = 0; i < 100; ++i)
                          inner = {{"type", "Sequence"}, {"normalizers", J::array({inner})}};
                        j["normalizer"] = inner;
                      })),
      "nests more than 64 levels deep");
  dir.write("broken.json", "{\"model\": ");
  EXPECT_CONTAINS(error_of((dir.path / "broken.json").string()), "not a JSON tokenizer file");
  EXPECT_CONTAINS(error_of((dir.path / "absent.json").string()), "cannot open the tokenizer file");
}

TEST(OpenTokenizer, FindsTheModelDirectoryTokenizerAndItsEos) {
  TempDir dir("model_dir");
  std::ifstream in(kFixtures / "qwen3" / "tokenizer.json", std::ios::binary);
  dir.write("tokenizer.json", std::string(std::istreambuf_iterator<char>(in), {}));
  const hf::Tokenizer reference((dir.path / "tokenizer.json").string());
  const int32_t endoftext = reference.id_of("<|endoftext|>"),
                im_end = reference.id_of("<|im_end|>");
  ASSERT_GE(endoftext, 0);
  ASSERT_GE(im_end, 0);
  // No file names an EOS: none.
  EXPECT_EQ(open_tokenizer(dir.path.string())->eos_id(), -1);
  // config.json's eos_token_id (an id or a list: its first).
  dir.write("config.json", "{\"eos_token_id\": [" + std::to_string(im_end) + ", 1]}");
  EXPECT_EQ(open_tokenizer(dir.path.string())->eos_id(), im_end);
  // tokenizer_config.json's eos_token wins (a string, or {"content": ...}).
  dir.write("tokenizer_config.json", "{\"eos_token\": {\"content\": \"<|endoftext|>\"}}");
  const auto t = open_tokenizer(dir.path.string());
  EXPECT_EQ(t->eos_id(), endoftext);
  EXPECT_EQ(t->kind(), "tokenizer.json");
  EXPECT_EQ(t->path(), (dir.path / "tokenizer.json").string());
  // The file itself finds the same files beside it; --eos overrides.
  EXPECT_EQ(open_tokenizer((dir.path / "tokenizer.json").string())->eos_id(), endoftext);
  EXPECT_EQ(open_tokenizer(dir.path.string(), "<|im_end|>")->eos_id(), im_end);
  EXPECT_CONTAINS(test_support::error_of([&] { open_tokenizer(dir.path.string(), "<|nope|>"); }),
                  "--eos \"<|nope|>\" is not a token of");
  dir.write("tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");
  EXPECT_CONTAINS(test_support::error_of([&] { open_tokenizer(dir.path.string()); }),
                  "tokenizer_config.json: eos_token \"<|nope|>\" is not a token of");
  TempDir empty("empty_dir");
  EXPECT_CONTAINS(test_support::error_of([&] { open_tokenizer(empty.path.string()); }),
                  "the directory has neither tokenizer.json nor tokenizer.model");
}

}  // namespace
}  // namespace moepeak
