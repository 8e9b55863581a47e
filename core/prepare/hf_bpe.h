// A tokenizer.json "model" of type BPE, encoding one pre-tokenized word the way Hugging Face
// tokenizers does: with ignore_merges, a word that is itself in the vocabulary is that token;
// otherwise each character is looked up (a missing one becomes its bytes' <0xXX> tokens with
// byte_fallback when all exist, else unk_token, consecutive ones fused with fuse_unk, else it
// is dropped), and the merges are applied lowest rank first, leftmost first among equals.
// Merges in either JSON form ("a b" strings or ["a", "b"] pairs). Refused (named): dropout,
// continuing_subword_prefix, end_of_word_suffix.
//
// encode() is const and thread-safe: each thread keeps its own cache of encoded words.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/prepare/hf_json.h"

namespace moepeak::hf {

// Heterogeneous lookup: a std::string_view finds a std::string key without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocabulary = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  explicit BpeModel(const JsonField& field);
  // Appends the ids of `word` (one pre-tokenized piece) to `ids`.
  void encode(std::string_view word, std::vector<int32_t>& ids) const;
  // The vocabulary's id of `token`, or -1.
  int32_t id_of(std::string_view token) const;
  int64_t vocab_size() const { return max_id_ + 1; }

 private:
  void merge(std::string_view word, std::vector<int32_t>& ids) const;

  Vocabulary vocab_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<int32_t> byte_tokens_;  // <0xXX> ids (byte_fallback), -1 where absent
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  int64_t max_id_ = -1;
  uint64_t instance_;  // tells this model's cache entries from another's on the same thread
};

}  // namespace moepeak::hf
