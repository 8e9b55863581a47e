// DocumentReader: see document_reader.h.
#include "core/prepare/document_reader.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/prepare/unicode_text.h"

namespace moepeak {

namespace {

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, InputFormat format, std::string key)
    : files_(std::move(files)), format_(format), key_(std::move(key)) {
  if (files_.empty()) MOEPEAK_INPUT_ERROR("no input files");
  for (const std::string& f : files_) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f, ec)) MOEPEAK_INPUT_ERROR(f, ": no such input file");
    total_bytes_ += std::filesystem::file_size(f, ec);
  }
}

bool DocumentReader::open_next() {
  if (in_.is_open()) {
    done_bytes_ += current_size_;
    in_.close();
  }
  if (next_file_ == files_.size()) return false;
  current_ = files_[next_file_++];
  in_.open(current_, std::ios::binary);
  if (!in_) MOEPEAK_INPUT_ERROR(current_, ": cannot open it for reading");
  std::error_code ec;
  current_size_ = std::filesystem::file_size(current_, ec);
  current_jsonl_ = format_ == InputFormat::jsonl ||
                   (format_ == InputFormat::automatic &&
                    (ends_with(current_, ".jsonl") || ends_with(current_, ".json")));
  line_ = 0;
  return true;
}

uint64_t DocumentReader::position() const {
  if (!in_.is_open()) return 0;
  auto& stream = const_cast<std::ifstream&>(in_);
  const std::streamoff at = stream.tellg();
  return at < 0 ? current_size_ : static_cast<uint64_t>(at);
}

bool DocumentReader::next_document(std::string& text) {
  text.clear();
  std::string line;
  if (current_jsonl_) {
    while (std::getline(in_, line)) {
      ++line_;
      if (blank(line)) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {  // a syntax error, a number out of range
        MOEPEAK_INPUT_ERROR(current_, ":", line_, ": not a JSON line (", e.what(), ")");
      }
      if (!j.is_object()) MOEPEAK_INPUT_ERROR(current_, ":", line_, ": not a JSON object");
      const auto field = j.find(key_);
      if (field == j.end()) MOEPEAK_INPUT_ERROR(current_, ":", line_, ": no \"", key_, "\" field");
      if (!field->is_string())
        MOEPEAK_INPUT_ERROR(current_, ":", line_, ": \"", key_, "\" is not a string");
      text = field->get<std::string>();
      return true;
    }
    return false;
  }
  bool any = false;
  while (std::getline(in_, line)) {
    ++line_;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t bad = unicode::first_invalid_utf8(line);
    if (bad != std::string::npos) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(line[bad]));
      MOEPEAK_INPUT_ERROR(current_, ":", line_, ": not valid UTF-8 (byte ", byte, " at column ",
                          bad + 1, ")");
    }
    if (blank(line)) {
      if (any) return true;
      continue;
    }
    if (any) text += '\n';
    text += line;
    any = true;
  }
  return any;
}

bool DocumentReader::read(std::vector<std::string>& out, size_t max_bytes) {
  size_t bytes = 0;
  bool got = false;
  std::string text;
  while (bytes < max_bytes) {
    if (!in_.is_open() && !open_next()) break;
    if (!next_document(text)) {
      if (!open_next()) break;
      continue;
    }
    if (text.empty()) {
      ++skipped_empty_;
      continue;
    }
    bytes += text.size();
    out.push_back(std::move(text));
    got = true;
  }
  return got;
}

}  // namespace moepeak
