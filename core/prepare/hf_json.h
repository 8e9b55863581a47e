// Reading a tokenizer.json section with errors in the file's terms: every accessor names the file
// and the field's path ("tokenizer.json: field \"pre_tokenizer.pretokenizers[1].behavior\": ...").
// Used by the tokenizer.json pipeline's parts (hf_normalizer, hf_pre_tokenizer, hf_bpe,
// hf_tokenizer).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/prepare/unicode_text.h"

namespace moepeak::hf {

struct JsonField {
  const nlohmann::json& value;
  std::string file;  // the tokenizer.json path
  std::string path;  // e.g. "pre_tokenizer.pretokenizers[1]"
  // NOTES: the parts recurse as the JSON nests (a Sequence of Sequences ...), so the nesting is
  // bounded here: a file cannot exhaust the stack.
  int depth = 0;
  static constexpr int kMaxDepth = 64;

  JsonField at(const std::string& key) const {
    if (!value.is_object() || !value.contains(key)) fail("is missing", key);
    if (depth >= kMaxDepth) fail("nests more than 64 levels deep");
    return {value.at(key), file, path.empty() ? key : path + "." + key, depth + 1};
  }
  JsonField at(size_t i) const {
    if (depth >= kMaxDepth) fail("nests more than 64 levels deep");
    return {value.at(i), file, path + "[" + std::to_string(i) + "]", depth + 1};
  }
  bool has(const std::string& key) const {
    return value.is_object() && value.contains(key) && !value.at(key).is_null();
  }
  bool is_null() const { return value.is_null(); }

  std::string string() const {
    if (!value.is_string()) fail("must be a string, not " + dump());
    return value.get<std::string>();
  }
  bool boolean() const {
    if (!value.is_boolean()) fail("must be true or false, not " + dump());
    return value.get<bool>();
  }
  int64_t integer() const {
    if (!value.is_number_integer()) fail("must be an integer, not " + dump());
    return value.get<int64_t>();
  }
  // An optional key: its value, or `fallback` when absent or null.
  bool boolean_or(const std::string& key, bool fallback) const {
    return has(key) ? at(key).boolean() : fallback;
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    return has(key) ? at(key).string() : fallback;
  }
  size_t size() const {
    if (!value.is_array()) fail("must be a list, not " + dump());
    return value.size();
  }
  std::string dump() const {
    std::string s = value.dump();
    if (s.size() > 80) {
      s.resize(77);
      s.append("...");
    }
    return s;
  }

  // Throws: "FILE: field \"PATH[.key]\" WHAT".
  [[noreturn]] void fail(const std::string& what, const std::string& key = "") const {
    const std::string where = key.empty() ? path : (path.empty() ? key : path + "." + key);
    MOEPEAK_INPUT_ERROR(file, ": field \"", where, "\" ", what);
  }
  // A type this implementation does not have: names it and what it has.
  [[noreturn]] void unsupported(const std::string& type, const std::string& implemented) const {
    MOEPEAK_INPUT_ERROR(file, ": field \"", path, ".type\" is \"", type,
                        "\", which moepeak does not implement (it implements ", implemented,
                        "); no encoding would be exact");
  }
};

// A Split's or Replace's pattern: {"String": s} (matched literally) or {"Regex": r}.
inline std::unique_ptr<unicode::Regex> pattern_of(const JsonField& field) {
  if (field.has("String")) {
    return std::make_unique<unicode::Regex>(field.at("String").string(), true,
                                            field.file + ": field \"" + field.path + ".String\"");
  }
  if (field.has("Regex")) {
    return std::make_unique<unicode::Regex>(field.at("Regex").string(), false,
                                            field.file + ": field \"" + field.path + ".Regex\"");
  }
  field.fail("must be {\"String\": ...} or {\"Regex\": ...}, not " + field.dump());
}

}  // namespace moepeak::hf
