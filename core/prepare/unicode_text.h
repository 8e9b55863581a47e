// Unicode text helpers for the tokenizer.json pipeline (core/prepare/hf_tokenizer.h): UTF-8
// decoding and encoding, the character classes Hugging Face tokenizers tests with Rust's char
// methods and regex classes, the four normalization forms (through utf8proc, Debian's
// libutf8proc-dev), and a compiled regular expression (through PCRE2, Debian's libpcre2-dev,
// with Unicode properties: \p{L}, \p{N}, (?i:...), lookahead — the syntax tokenizer.json files
// write for the Oniguruma engine tokenizers uses).
//
// Every function takes and returns valid UTF-8 (the document reader checks its input); a
// pattern that does not compile throws moepeak::Error with PCRE2's message and offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace moepeak::unicode {

// The offset of the first byte of `s` that does not start or continue a well-formed UTF-8
// sequence (overlong forms, surrogates and code points past U+10FFFF are ill-formed), or npos.
size_t first_invalid_utf8(std::string_view s);

// The code point at s[pos] (valid UTF-8), advancing pos past it.
char32_t next_code_point(std::string_view s, size_t& pos);
// Bytes of the UTF-8 sequence that starts with `lead`.
inline size_t sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
void append_utf8(std::string& out, char32_t c);
// The first / last code point of a non-empty string.
char32_t first_code_point(std::string_view s);
char32_t last_code_point(std::string_view s);

// Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t c);
// Rust's char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// The regex crate's \w: letters, marks, decimal digits, connector punctuation (and Nl), which
// tokenizers' added tokens test for single_word.
bool is_word_char(char32_t c);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
// `s` in the normal form (utf8proc; Unicode's canonical ordering and composition).
std::string normalize(std::string_view s, NormalForm form);

// A compiled regular expression (UTF-8, Unicode properties, JIT where available). Thread-safe
// for matching: each thread keeps its own match data.
class Regex {
 public:
  // `literal`: the pattern matches its text exactly (a Split's {"String": ...}).
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls found(begin, end) for each successive non-overlapping match in `s`, left to right (an
  // empty match advances one character), as the regex crate and Oniguruma's find_iter do.
  void find_all(std::string_view s, const std::function<void(size_t, size_t)>& found) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::string where_;  // the file the pattern came from, for errors
  std::unique_ptr<Impl> impl_;
};

}  // namespace moepeak::unicode
