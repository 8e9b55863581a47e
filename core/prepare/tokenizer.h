// Tokenizer: a SentencePiece model (Mixtral's and Llama 2's tokenizer.model are ones) loaded for
// encoding. SentencePiece's headers stay in tokenizer.cpp. encode() is const and may run on many
// threads at once on one Tokenizer (SentencePieceProcessor::Encode is const and keeps no state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moepeak {

class Tokenizer {
 public:
  // Throws moepeak::Error naming the path when it is missing or not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  const std::string& path() const { return path_; }
  int64_t vocab_size() const;
  int32_t eos_id() const;  // -1 when the model has none
  int32_t bos_id() const;  // -1 when the model has none
  // Appends the ids of `text` to `ids` (no BOS or EOS). Throws moepeak::Error on a SentencePiece
  // failure.
  void encode(std::string_view text, std::vector<int32_t>& ids) const;

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moepeak
