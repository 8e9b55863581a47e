// Tokenizer: what `moepeak data prepare` encodes documents with, opened from what a model's
// download holds (open_tokenizer):
//   - a tokenizer.json (Hugging Face tokenizers: gpt-oss, Qwen3, DeepSeek-V3, Llama 3, Mistral;
//     core/prepare/hf_tokenizer.h), encoded as tokenizers' encode() with its post-processor's
//     special tokens;
//   - a SentencePiece tokenizer.model (Mixtral, Llama 2), its pieces without BOS or EOS;
//   - a model directory: its tokenizer.json, else its tokenizer.model.
// EOS and BOS: `eos` when given (a token of the vocabulary), else tokenizer_config.json's
// eos_token / bos_token beside the file, else config.json's or generation_config.json's
// eos_token_id / bos_token_id, else (SentencePiece) the model's own; -1 when none names one.
// encode() is const and may run on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moepeak {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  const std::string& path() const { return path_; }  // the file read
  const std::string& kind() const { return kind_; }  // "tokenizer.json" or "SentencePiece"
  virtual int64_t vocab_size() const = 0;
  int32_t eos_id() const { return eos_; }  // -1 when none
  int32_t bos_id() const { return bos_; }  // -1 when none
  // Appends the ids of `text`. Throws moepeak::Error when the tokenizer cannot encode it.
  virtual void encode(std::string_view text, std::vector<int32_t>& ids) const = 0;
  // The id of a token of the vocabulary, or -1.
  virtual int32_t id_of(std::string_view token) const = 0;

 protected:
  std::string path_, kind_;
  int32_t eos_ = -1, bos_ = -1;
  friend std::unique_ptr<Tokenizer> open_tokenizer(const std::string&, const std::string&);
};

// Throws moepeak::Error naming the path (or the file and field) when it is missing, not a
// tokenizer, uses what is not implemented, or `eos` is not one of its tokens.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, const std::string& eos = "");

}  // namespace moepeak
