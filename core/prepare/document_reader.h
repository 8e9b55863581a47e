// DocumentReader: the documents of a list of text or JSONL files, in order, a bounded chunk at a
// time (`moepeak data prepare`).
//
//   text   documents are separated by one or more blank lines (empty or whitespace only); a
//          document's lines are kept with their newlines between them ("\r\n" read as "\n").
//   jsonl  one JSON object per line, the document its `key` field ("text"); blank lines skipped.
// A file's format is `format`, or with InputFormat::automatic .jsonl / .json means jsonl and
// anything else text. Documents whose text is empty are skipped (and counted).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace moepeak {

enum class InputFormat { automatic, text, jsonl };

class DocumentReader {
 public:
  // Throws moepeak::Error naming the first input that is missing or not a regular file.
  DocumentReader(std::vector<std::string> files, InputFormat format, std::string key = "text");

  // Appends the next documents to `out` until their text reaches `max_bytes` (at least one
  // document) or the input ends; returns false when nothing was left. Throws moepeak::Error
  // naming the file and line of a JSONL line that is not a JSON object, has no `key` field, or
  // whose field is not a string, and of a line that is not valid UTF-8 (JSON's parser checks a
  // JSONL line's strings; a text line is checked here), so a tokenizer only ever sees valid
  // UTF-8.
  bool read(std::vector<std::string>& out, size_t max_bytes);

  uint64_t total_bytes() const { return total_bytes_; }  // of every input file
  uint64_t bytes_read() const { return done_bytes_ + position(); }
  uint64_t skipped_empty() const { return skipped_empty_; }

 private:
  bool open_next();
  bool next_document(std::string& text);  // false at the end of the current file
  uint64_t position() const;
  std::vector<std::string> files_;
  InputFormat format_;
  std::string key_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string current_;  // the open file
  bool current_jsonl_ = false;
  uint64_t line_ = 0;
  uint64_t current_size_ = 0, done_bytes_ = 0, total_bytes_ = 0;
  uint64_t skipped_empty_ = 0;
};

}  // namespace moepeak
