// A tokenizer.json "normalizer": what Hugging Face tokenizers does to a text piece before
// pre-tokenization (each piece the added tokens leave, on its own). Implemented: NFC, NFD,
// NFKC, NFKD (utf8proc), Sequence, Prepend (its text in front of a non-empty piece), Replace (a
// literal or regex pattern, every match replaced); null is none. Any other type is an error
// naming the field.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/prepare/hf_json.h"
#include "core/prepare/unicode_text.h"

namespace moepeak::hf {

class Normalizer {
 public:
  // From the JSON object at `field` (not null).
  explicit Normalizer(const JsonField& field);
  ~Normalizer();
  // The piece, normalized in place.
  void apply(std::string& text) const;

 private:
  enum class Kind { form, sequence, prepend, replace };
  Kind kind_ = Kind::form;
  unicode::NormalForm form_ = unicode::NormalForm::nfc;
  std::vector<std::unique_ptr<Normalizer>> children_;
  std::string text_;  // Prepend's text, Replace's content
  std::unique_ptr<unicode::Regex> pattern_;
};

}  // namespace moepeak::hf
