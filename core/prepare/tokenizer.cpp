// open_tokenizer and its two kinds: see tokenizer.h. SentencePiece's headers stay in this file.
#include "core/prepare/tokenizer.h"

#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/prepare/hf_tokenizer.h"

namespace moepeak {

namespace fs = std::filesystem;

namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path) {
    const auto status = processor_.Load(model_path);
    if (!status.ok())
      MOEPEAK_INPUT_ERROR(model_path, ": not a SentencePiece model (", status.ToString(), ")");
    eos_ = processor_.eos_id();
    bos_ = processor_.bos_id();
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  void encode(std::string_view text, std::vector<int32_t>& ids) const override {
    std::vector<int> out;
    const auto status = processor_.Encode(text, &out);
    if (!status.ok())
      MOEPEAK_INPUT_ERROR(path_, ": SentencePiece could not encode: ", status.ToString());
    ids.insert(ids.end(), out.begin(), out.end());
  }
  int32_t id_of(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    // PieceToId answers unk_id for a piece it does not have.
    return id == processor_.unk_id() && processor_.IdToPiece(id) != token ? -1 : id;
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

class JsonTokenizer : public Tokenizer {
 public:
  explicit JsonTokenizer(const std::string& path) : tokenizer_(path) {}
  int64_t vocab_size() const override { return tokenizer_.vocab_size(); }
  void encode(std::string_view text, std::vector<int32_t>& ids) const override {
    tokenizer_.encode(text, ids, /*special_tokens=*/true);
  }
  int32_t id_of(std::string_view token) const override { return tokenizer_.id_of(token); }

 private:
  hf::Tokenizer tokenizer_;
};

// `dir`/`name` parsed, or nullopt when absent.
std::optional<nlohmann::json> read_json(const fs::path& dir, const char* name) {
  const fs::path p = dir / name;
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOEPEAK_INPUT_ERROR(p.string(), ": not valid JSON (", e.what(), ")");
  }
}

// tokenizer_config.json's "eos_token" / "bos_token": a string or {"content": ...}; "" if none.
std::string special_token_text(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const nlohmann::json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return "";
}

// config.json's "eos_token_id" / "bos_token_id": an id or a list (its first); -1 if none.
int32_t special_token_id(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return -1;
  const nlohmann::json& v = config.at(key);
  if (v.is_number_integer()) return v.get<int32_t>();
  if (v.is_array() && !v.empty() && v.at(0).is_number_integer()) return v.at(0).get<int32_t>();
  return -1;
}

// The EOS or BOS that the files beside the tokenizer name (tokenizer.h), or -1.
int32_t id_from_model_files(const Tokenizer& t, const fs::path& dir, bool eos) {
  const char* token_key = eos ? "eos_token" : "bos_token";
  const char* id_key = eos ? "eos_token_id" : "bos_token_id";
  if (const auto config = read_json(dir, "tokenizer_config.json")) {
    const std::string text = special_token_text(*config, token_key);
    if (!text.empty()) {
      const int32_t id = t.id_of(text);
      if (id < 0) {
        MOEPEAK_INPUT_ERROR((dir / "tokenizer_config.json").string(), ": ", token_key, " \"", text,
                            "\" is not a token of ", t.path());
      }
      return id;
    }
  }
  for (const char* name : {"generation_config.json", "config.json"}) {
    if (const auto config = read_json(dir, name)) {
      const int32_t id = special_token_id(*config, id_key);
      if (id >= 0) return id;
    }
  }
  return -1;
}

}  // namespace

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, const std::string& eos) {
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) {
    if (fs::is_regular_file(file / "tokenizer.json", ec)) {
      file /= "tokenizer.json";
    } else if (fs::is_regular_file(file / "tokenizer.model", ec)) {
      file /= "tokenizer.model";
    } else {
      MOEPEAK_INPUT_ERROR(path, ": the directory has neither tokenizer.json nor tokenizer.model");
    }
  } else if (!fs::is_regular_file(file, ec)) {
    MOEPEAK_INPUT_ERROR(path, ": no such tokenizer file or model directory");
  }
  const bool json = file.extension() == ".json";
  std::unique_ptr<Tokenizer> t;
  if (json) {
    t = std::make_unique<JsonTokenizer>(file.string());
  } else {
    t = std::make_unique<SentencePieceTokenizer>(file.string());
  }
  t->path_ = file.string();
  t->kind_ = json ? "tokenizer.json" : "SentencePiece";
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const int32_t eos_from_files = id_from_model_files(*t, dir, true);
  const int32_t bos_from_files = id_from_model_files(*t, dir, false);
  if (eos_from_files >= 0) t->eos_ = eos_from_files;
  if (bos_from_files >= 0) t->bos_ = bos_from_files;
  if (!eos.empty()) {
    t->eos_ = t->id_of(eos);
    if (t->eos_ < 0) MOEPEAK_INPUT_ERROR("--eos \"", eos, "\" is not a token of ", t->path_);
  }
  return t;
}

}  // namespace moepeak
