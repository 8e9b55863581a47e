// A tokenizer.json tokenizer: see hf_tokenizer.h.
#include "core/prepare/hf_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/prepare/hf_bpe.h"
#include "core/prepare/hf_json.h"
#include "core/prepare/hf_normalizer.h"
#include "core/prepare/hf_pre_tokenizer.h"
#include "core/prepare/unicode_text.h"

namespace moepeak::hf {

namespace {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest, non-overlapping matches of a set of strings (the aho-corasick automaton
// tokenizers builds with MatchKind::LeftmostLongest), by first byte then longest first.
class TokenMatcher {
 public:
  void add(std::string pattern, size_t token) {
    if (pattern.empty()) return;
    const auto first = static_cast<unsigned char>(pattern[0]);
    by_first_byte_[first].push_back({std::move(pattern), token});
    auto& group = by_first_byte_[first];
    std::stable_sort(group.begin(), group.end(), [](const Entry& a, const Entry& b) {
      return a.pattern.size() > b.pattern.size();
    });
    any_ = true;
  }
  bool empty() const { return !any_; }
  // Calls found(begin, end, token) for each match, left to right.
  template <class Found>
  void find_all(std::string_view s, Found found) const {
    size_t i = 0;
    while (i < s.size()) {
      const auto& group = by_first_byte_[static_cast<unsigned char>(s[i])];
      const Entry* hit = nullptr;
      for (const Entry& e : group) {
        if (s.compare(i, e.pattern.size(), e.pattern) == 0) {
          hit = &e;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      found(i, i + hit->pattern.size(), hit->token);
      i += hit->pattern.size();
    }
  }

 private:
  struct Entry {
    std::string pattern;
    size_t token;
  };
  std::vector<Entry> by_first_byte_[256];
  bool any_ = false;
};

// Where the run of whitespace that ends `s` starts (tokenizers' space_leftmost_at_end).
size_t whitespace_run_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t begin = start - 1;
    while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
    if (!unicode::is_whitespace(unicode::first_code_point(s.substr(begin)))) break;
    start = begin;
  }
  return start;
}

// The length of the run of whitespace that starts `s` (space_rightmost_at_start).
size_t whitespace_run_length(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!unicode::is_whitespace(unicode::next_code_point(s, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_ids;
  TokenMatcher raw_tokens, normalized_tokens;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::vector<int32_t> prefix, suffix;  // the post-processor's
  int64_t max_added_id = -1, max_template_id = -1;

  void add_post_processor(const JsonField& field);
  // Splits `piece` around the matches of `matcher` (tokenizers' AddedVocabulary::find_matches).
  void split_added(const Piece& piece, const TokenMatcher& matcher, std::vector<Piece>& out) const;
};

void Tokenizer::Impl::add_post_processor(const JsonField& field) {
  const std::string type = field.at("type").string();
  if (type == "ByteLevel") return;  // offsets only: no ids
  if (type == "Sequence") {
    const JsonField list = field.at("processors");
    for (size_t i = 0; i < list.size(); ++i) add_post_processor(list.at(i));
    return;
  }
  if (type != "TemplateProcessing") {
    field.unsupported(type, "TemplateProcessing, ByteLevel, Sequence");
  }
  const JsonField specials = field.at("special_tokens");
  const JsonField single = field.at("single");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonField item = single.at(i);
    if (item.has("Sequence")) {
      const std::string which = item.at("Sequence").at("id").string();
      if (which != "A")
        item.at("Sequence").at("id").fail("is \"" + which + "\"; a single template reads A");
      seen_sequence = true;
      continue;
    }
    if (!item.has("SpecialToken"))
      item.fail("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const std::string name = item.at("SpecialToken").at("id").string();
    if (!specials.has(name))
      specials.fail("has no \"" + name + "\", which the single template names");
    const JsonField ids = specials.at(name).at("ids");
    for (size_t k = 0; k < ids.size(); ++k) {
      const int64_t id = ids.at(k).integer();
      if (id < 0 || id > INT32_MAX) ids.at(k).fail("is " + std::to_string(id) + "; ids are >= 0");
      max_template_id = std::max(max_template_id, id);
      (seen_sequence ? after : before).push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_sequence) single.fail("has no {\"Sequence\": {\"id\": \"A\"}}");
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
}

void Tokenizer::Impl::split_added(const Piece& piece, const TokenMatcher& matcher,
                                  std::vector<Piece>& out) const {
  const std::string& s = piece.text;
  size_t start_offset = 0;
  auto text = [&](size_t begin, size_t end) {
    if (end > begin) out.push_back({s.substr(begin, end - begin), piece.at_origin && begin == 0});
  };
  matcher.find_all(s, [&](size_t start, size_t stop, size_t index) {
    const AddedToken& t = added[index];
    if (t.single_word) {
      const bool start_space =
          start == 0 || !unicode::is_word_char(unicode::last_code_point(s.substr(0, start)));
      const bool stop_space =
          stop == s.size() || !unicode::is_word_char(unicode::first_code_point(s.substr(stop)));
      if (!start_space || !stop_space) return;
    }
    if (t.lstrip) start = std::max(whitespace_run_start(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += whitespace_run_length(std::string_view(s).substr(stop));
    if (start_offset < start) text(start_offset, start);
    out.push_back({s.substr(start, stop - start), piece.at_origin && start == 0, t.id});
    start_offset = stop;
  });
  text(start_offset, s.size());
}

Tokenizer::Tokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) MOEPEAK_INPUT_ERROR(path, ": cannot open the tokenizer file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOEPEAK_INPUT_ERROR(path, ": not a JSON tokenizer file (", e.what(), ")");
  }
  const JsonField root{doc, path, ""};
  if (!doc.is_object()) root.fail("must be an object (a tokenizer.json)");
  for (const char* key : {"truncation", "padding"}) {
    if (root.has(key)) root.at(key).fail("is set; encoding for data preparation needs it null");
  }
  impl_->model = std::make_unique<BpeModel>(root.at("model"));
  if (root.has("normalizer"))
    impl_->normalizer = std::make_unique<Normalizer>(root.at("normalizer"));
  if (root.has("pre_tokenizer"))
    impl_->pre_tokenizer = std::make_unique<PreTokenizer>(root.at("pre_tokenizer"));
  if (root.has("post_processor")) impl_->add_post_processor(root.at("post_processor"));
  if (root.has("added_tokens")) {
    const JsonField list = root.at("added_tokens");
    for (size_t i = 0; i < list.size(); ++i) {
      const JsonField t = list.at(i);
      AddedToken a;
      a.content = t.at("content").string();
      const int64_t id = t.at("id").integer();
      if (id < 0 || id > INT32_MAX) t.at("id").fail("is " + std::to_string(id) + "; ids are >= 0");
      a.id = static_cast<int32_t>(id);
      // NOTES: tokenizers gives an added token whose content is in the model's vocabulary that
      // id whatever the file says; a file that disagrees would encode differently here.
      const int32_t in_vocab = impl_->model->id_of(a.content);
      if (in_vocab >= 0 && in_vocab != a.id) {
        t.at("id").fail("is " + std::to_string(a.id) + ", but \"" + a.content +
                        "\" is the model vocabulary's id " + std::to_string(in_vocab));
      }
      a.special = t.boolean_or("special", false);
      a.single_word = t.boolean_or("single_word", false);
      a.lstrip = t.boolean_or("lstrip", false);
      a.rstrip = t.boolean_or("rstrip", false);
      a.normalized = t.boolean_or("normalized", !a.special);
      impl_->max_added_id = std::max<int64_t>(impl_->max_added_id, a.id);
      impl_->added_ids[a.content] = a.id;
      impl_->added.push_back(std::move(a));
    }
    // NOTES: tokenizers builds its matchers from the special tokens first, then the others.
    for (const bool special : {true, false}) {
      for (size_t i = 0; i < impl_->added.size(); ++i) {
        const AddedToken& a = impl_->added[i];
        if (a.special != special) continue;
        if (!a.normalized) {
          impl_->raw_tokens.add(a.content, i);
        } else {
          std::string pattern = a.content;
          if (impl_->normalizer) impl_->normalizer->apply(pattern);
          impl_->normalized_tokens.add(std::move(pattern), i);
        }
      }
    }
  }
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& ids,
                       bool special_tokens) const {
  const Impl& m = *impl_;
  if (special_tokens) ids.insert(ids.end(), m.prefix.begin(), m.prefix.end());
  std::vector<Piece> pieces;
  const Piece whole{std::string(text), true};
  if (m.raw_tokens.empty()) {
    if (!whole.text.empty()) pieces.push_back(whole);
  } else {
    m.split_added(whole, m.raw_tokens, pieces);
  }
  if (m.normalizer || !m.normalized_tokens.empty()) {
    std::vector<Piece> normalized;
    for (Piece& p : pieces) {
      if (p.token >= 0) {
        normalized.push_back(std::move(p));
        continue;
      }
      if (m.normalizer) m.normalizer->apply(p.text);
      if (m.normalized_tokens.empty()) {
        if (!p.text.empty()) normalized.push_back(std::move(p));
      } else {
        m.split_added(p, m.normalized_tokens, normalized);
      }
    }
    pieces = std::move(normalized);
  }
  if (m.pre_tokenizer) m.pre_tokenizer->apply(pieces);
  for (const Piece& p : pieces) {
    if (p.token >= 0) {
      ids.push_back(p.token);
    } else {
      m.model->encode(p.text, ids);
    }
  }
  if (special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
}

int32_t Tokenizer::id_of(std::string_view token) const {
  const auto it = impl_->added_ids.find(std::string(token));
  return it != impl_->added_ids.end() ? it->second : impl_->model->id_of(token);
}

int64_t Tokenizer::vocab_size() const {
  return std::max(
      {impl_->model->vocab_size(), impl_->max_added_id + 1, impl_->max_template_id + 1});
}

const std::vector<int32_t>& Tokenizer::template_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::template_suffix() const { return impl_->suffix; }

}  // namespace moepeak::hf
