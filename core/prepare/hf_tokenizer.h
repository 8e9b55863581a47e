// A Hugging Face tokenizers tokenizer.json (byte-level BPE: gpt-oss, Qwen3, DeepSeek-V3; BPE with
// byte fallback: Llama and Mistral's), encoding as tokenizers' Tokenizer::encode does with
// add_special_tokens:
//   1. added tokens (added_tokens; special or not) are found in the raw text, leftmost-longest,
//      those with normalized = false before normalization and the others in each normalized
//      piece, with their single_word, lstrip and rstrip rules; each becomes its id;
//   2. every other piece is normalized (hf_normalizer.h), pre-tokenized (hf_pre_tokenizer.h)
//      and encoded word by word by the model (hf_bpe.h);
//   3. the post-processor adds its special tokens around the ids (TemplateProcessing's single
//      template; ByteLevel adds none; Sequence of them).
// truncation and padding must be null. Every field this does not implement is an error naming
// it (moepeak::Error, "FILE: field \"PATH\" ..."): an encoding is exact or refused.
//
// encode() is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moepeak::hf {

class Tokenizer {
 public:
  // Reads and checks `path` (a tokenizer.json).
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Appends the ids of `text`; with `special_tokens`, the post-processor's too.
  void encode(std::string_view text, std::vector<int32_t>& ids, bool special_tokens = true) const;
  // The id of a token (an added token's or the model's), or -1.
  int32_t id_of(std::string_view token) const;
  // One past the largest id it can give (the model's vocabulary, added tokens, the template's).
  int64_t vocab_size() const;
  // The special tokens the post-processor puts before / after a text's ids (may be empty).
  const std::vector<int32_t>& template_prefix() const;
  const std::vector<int32_t>& template_suffix() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moepeak::hf
