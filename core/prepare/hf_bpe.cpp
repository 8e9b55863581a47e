// A tokenizer.json BPE model: see hf_bpe.h.
#include "core/prepare/hf_bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "core/prepare/unicode_text.h"

namespace moepeak::hf {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::atomic<uint64_t> next_instance{1};

// Per thread: the words encoded lately, of one model at a time (HF's cache holds 10,000).
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};
constexpr size_t kCacheWords = 1 << 16;

}  // namespace

BpeModel::BpeModel(const JsonField& field) : instance_(next_instance++) {
  const std::string type = field.string_or("type", "BPE");
  if (type != "BPE") field.unsupported(type, "BPE");
  if (field.has("dropout")) field.at("dropout").fail("is set; BPE dropout is not implemented");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (field.has(key) && !field.at(key).string().empty())
      field.at(key).fail("is set; it is not implemented (no family's tokenizer uses it)");
  }
  ignore_merges_ = field.boolean_or("ignore_merges", false);
  byte_fallback_ = field.boolean_or("byte_fallback", false);
  fuse_unk_ = field.boolean_or("fuse_unk", false);

  const JsonField vocab = field.at("vocab");
  if (!vocab.value.is_object()) vocab.fail("must be an object of token: id");
  vocab_.reserve(vocab.value.size());
  for (const auto& [token, id] : vocab.value.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      vocab.fail("has token \"" + token + "\" with id " + id.dump() + "; ids are integers >= 0");
    const auto i = id.get<int32_t>();
    vocab_.emplace(token, i);
    max_id_ = std::max<int64_t>(max_id_, i);
  }
  if (field.has("unk_token")) {
    const std::string unk = field.at("unk_token").string();
    unk_id_ = id_of(unk);
    if (unk_id_ < 0) field.at("unk_token").fail("is \"" + unk + "\", which is not in the vocab");
  }
  byte_tokens_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_tokens_[static_cast<size_t>(b)] = id_of(name);
  }

  const JsonField merges = field.at("merges");
  const size_t n = merges.size();
  merges_.reserve(n);
  for (size_t rank = 0; rank < n; ++rank) {
    const JsonField m = merges.at(rank);
    std::string left, right;
    if (m.value.is_string()) {  // "left right"
      const std::string s = m.string();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.fail("is \"" + s + "\"; a merge is two tokens separated by one space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.value.is_array() && m.value.size() == 2 && m.value[0].is_string() &&
               m.value[1].is_string()) {
      left = m.value[0].get<std::string>();
      right = m.value[1].get<std::string>();
    } else {
      m.fail("must be \"left right\" or [\"left\", \"right\"], not " + m.dump());
    }
    const int32_t l = id_of(left), r = id_of(right), merged = id_of(left + right);
    if (l < 0 || r < 0 || merged < 0) {
      m.fail("merges \"" + left + "\" and \"" + right + "\", but \"" +
             (l < 0   ? left
              : r < 0 ? right
                      : left + right) +
             "\" is not in the vocab");
    }
    merges_.try_emplace(pair_key(l, r), static_cast<int32_t>(rank), merged);
  }
}

int32_t BpeModel::id_of(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t whole = id_of(word);
    if (whole >= 0) {
      ids.push_back(whole);
      return;
    }
  }
  thread_local WordCache cache;
  if (cache.owner != instance_) {
    cache.words.clear();
    cache.owner = instance_;
  }
  const auto hit = cache.words.find(word);
  if (hit != cache.words.end()) {
    ids.insert(ids.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> out;
  merge(word, out);
  ids.insert(ids.end(), out.begin(), out.end());
  if (cache.words.size() >= kCacheWords) cache.words.clear();
  cache.words.emplace(std::string(word), std::move(out));
}

void BpeModel::merge(std::string_view word, std::vector<int32_t>& ids) const {
  // The word's symbols: each character's id (or its bytes', or unk).
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  int32_t pending_unk = -1;  // fuse_unk: one unk for a run of unknown characters
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t at = pos;
    pos += unicode::sequence_length(static_cast<unsigned char>(word[pos]));
    const std::string_view ch = word.substr(at, pos - at);
    const int32_t id = id_of(ch);
    if (id >= 0) {
      if (pending_unk >= 0) symbols.push_back(pending_unk);
      pending_unk = -1;
      symbols.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_tokens_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(byte_tokens_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
      pending_unk = unk_id_;
    }
    // NOTES: without unk_token an unknown character is dropped, as tokenizers does.
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);

  // Merges, lowest rank first, then leftmost (tokenizers' Word::merge_all): a queue of candidate
  // pairs by their left symbol's position, checked again when popped.
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int32_t i = 0; i < n; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto offer = [&](int32_t left) {
    const int32_t right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    const auto it = merges_.find(
        pair_key(symbols[static_cast<size_t>(left)], symbols[static_cast<size_t>(right)]));
    if (it != merges_.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const auto p = static_cast<size_t>(top.pos);
    if (!alive[p] || next[p] < 0) continue;
    const auto r = static_cast<size_t>(next[p]);
    const auto it = merges_.find(pair_key(symbols[p], symbols[r]));
    if (it == merges_.end() || it->second.second != top.merged) continue;
    symbols[p] = top.merged;
    alive[r] = 0;
    next[p] = next[r];
    if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = top.pos;
    if (prev[p] >= 0) offer(prev[p]);
    offer(top.pos);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (alive[static_cast<size_t>(i)]) ids.push_back(symbols[static_cast<size_t>(i)]);
  }
}

}  // namespace moepeak::hf
