// A tokenizer.json "pre_tokenizer": how Hugging Face tokenizers cuts a normalized piece into
// the words the model encodes one at a time. Implemented:
//   Split      a literal or regex pattern; behavior Removed, Isolated, MergedWithPrevious,
//              MergedWithNext or Contiguous; invert (the non-matches are the delimiters)
//   ByteLevel  add_prefix_space (a space in front of every piece that does not start with one),
//              use_regex (GPT-2's pattern, Isolated), then each byte as GPT-2's printable
//              character (the byte-level alphabet the vocabulary is written in)
//   Digits     individual_digits: each numeric character alone, else runs of them
//   Metaspace  spaces to the replacement; prepend_scheme always / first (only the piece at the
//              text's start) / never; split before each replacement (MergedWithNext)
//   Sequence   each in turn
// Any other type is an error naming the field. A piece holding an added token is left alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/prepare/hf_json.h"
#include "core/prepare/unicode_text.h"

namespace moepeak::hf {

// One piece of the text on its way to the model.
struct Piece {
  std::string text;
  bool at_origin = false;  // starts where the original text starts (Metaspace's "first")
  int32_t token = -1;      // an added token's id: passed through, never cut or encoded
};

// GPT-2's byte-level alphabet: the printable character each byte is written as (UTF-8).
const std::string& byte_level_char(unsigned char byte);

class PreTokenizer {
 public:
  explicit PreTokenizer(const JsonField& field);
  ~PreTokenizer();
  // Cuts (and rewrites) every piece without a token; pieces come out in text order, empty
  // ones dropped.
  void apply(std::vector<Piece>& pieces) const;
  // Whether the last step is ByteLevel (the model then sees the byte-level alphabet).
  bool ends_byte_level() const;

 private:
  enum class Kind { split, byte_level, digits, metaspace, sequence };
  enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
  void apply_one(const Piece& piece, std::vector<Piece>& out) const;

  Kind kind_ = Kind::split;
  Behavior behavior_ = Behavior::isolated;
  bool invert_ = false;
  bool add_prefix_space_ = false, use_regex_ = false, individual_digits_ = false;
  bool split_ = true;
  enum class Prepend { always, first, never } prepend_ = Prepend::always;
  std::string replacement_;
  std::unique_ptr<unicode::Regex> pattern_;
  std::vector<std::unique_ptr<PreTokenizer>> children_;
};

}  // namespace moepeak::hf
