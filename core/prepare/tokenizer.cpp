// Tokenizer over SentencePiece's processor: see tokenizer.h.
#include "core/prepare/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/error.h"

namespace moepeak {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec))
    MOEPEAK_INPUT_ERROR(model_path, ": no such tokenizer model file");
  const auto status = impl_->processor.Load(model_path);
  if (!status.ok()) {
    MOEPEAK_INPUT_ERROR(model_path, ": not a SentencePiece model (", status.ToString(), ")");
  }
}

Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return impl_->processor.eos_id(); }
int32_t Tokenizer::bos_id() const { return impl_->processor.bos_id(); }

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<int> out;
  const auto status = impl_->processor.Encode(text, &out);
  if (!status.ok()) MOEPEAK_THROW(path_, ": SentencePiece could not encode: ", status.ToString());
  ids.insert(ids.end(), out.begin(), out.end());
}

}  // namespace moepeak
