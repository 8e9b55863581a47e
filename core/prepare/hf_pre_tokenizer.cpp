// A tokenizer.json pre-tokenizer: see hf_pre_tokenizer.h.
#include "core/prepare/hf_pre_tokenizer.h"

#include <algorithm>
#include <array>

namespace moepeak::hf {

namespace {

const char* const kImplemented = "Split, ByteLevel, Digits, Metaspace, Sequence";
// GPT-2's pre-tokenization pattern (ByteLevel with use_regex).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Segment {
  size_t begin, end;
  bool is_match;
};

// The segments of `text` around the matches of `pattern` (tokenizers' find_matches).
std::vector<Segment> regex_segments(const std::string& text, const unicode::Regex& pattern) {
  std::vector<Segment> out;
  size_t previous = 0;
  pattern.find_all(text, [&](size_t begin, size_t end) {
    if (previous != begin) out.push_back({previous, begin, false});
    out.push_back({begin, end, true});
    previous = end;
  });
  if (previous != text.size()) out.push_back({previous, text.size(), false});
  return out;
}

// The segments of `text` where each character for which `matches` holds is a match of its own
// and the runs between are not (tokenizers' Pattern for a char predicate).
template <class Predicate>
std::vector<Segment> char_segments(const std::string& text, Predicate matches) {
  std::vector<Segment> out;
  size_t run = 0, pos = 0;
  while (pos < text.size()) {
    const size_t at = pos;
    const char32_t c = unicode::next_code_point(text, pos);
    if (matches(c)) {
      if (run != at) out.push_back({run, at, false});
      out.push_back({at, pos, true});
      run = pos;
    }
  }
  if (run != text.size()) out.push_back({run, text.size(), false});
  return out;
}

}  // namespace

const std::string& byte_level_char(unsigned char byte) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      unicode::append_utf8(t[static_cast<size_t>(b)],
                           printable ? static_cast<char32_t>(b) : next++);
    }
    return t;
  }();
  return table[byte];
}

PreTokenizer::PreTokenizer(const JsonField& field) {
  const std::string type = field.at("type").string();
  if (type == "Split") {
    kind_ = Kind::split;
    pattern_ = pattern_of(field.at("pattern"));
    const std::string behavior = field.at("behavior").string();
    if (behavior == "Removed") {
      behavior_ = Behavior::removed;
    } else if (behavior == "Isolated") {
      behavior_ = Behavior::isolated;
    } else if (behavior == "MergedWithPrevious") {
      behavior_ = Behavior::merged_with_previous;
    } else if (behavior == "MergedWithNext") {
      behavior_ = Behavior::merged_with_next;
    } else if (behavior == "Contiguous") {
      behavior_ = Behavior::contiguous;
    } else {
      field.at("behavior")
          .fail("is \"" + behavior +
                "\"; one of Removed, Isolated, MergedWithPrevious, "
                "MergedWithNext, Contiguous");
    }
    invert_ = field.boolean_or("invert", false);
  } else if (type == "ByteLevel") {
    kind_ = Kind::byte_level;
    add_prefix_space_ = field.boolean_or("add_prefix_space", true);
    use_regex_ = field.boolean_or("use_regex", true);
    if (use_regex_) pattern_ = std::make_unique<unicode::Regex>(kGpt2Pattern, false, field.path);
  } else if (type == "Digits") {
    kind_ = Kind::digits;
    individual_digits_ = field.boolean_or("individual_digits", false);
  } else if (type == "Metaspace") {
    kind_ = Kind::metaspace;
    replacement_ = field.string_or("replacement", "\xE2\x96\x81");  // U+2581
    size_t pos = 0;
    if (replacement_.empty() ||
        (unicode::next_code_point(replacement_, pos), pos != replacement_.size())) {
      field.at("replacement").fail("must be one character, not " + field.at("replacement").dump());
    }
    split_ = field.boolean_or("split", true);
    if (field.has("prepend_scheme")) {
      const std::string scheme = field.at("prepend_scheme").string();
      if (scheme == "always") {
        prepend_ = Prepend::always;
      } else if (scheme == "first") {
        prepend_ = Prepend::first;
      } else if (scheme == "never") {
        prepend_ = Prepend::never;
      } else {
        field.at("prepend_scheme").fail("is \"" + scheme + "\"; one of always, first, never");
      }
    } else if (field.has("add_prefix_space")) {  // the form before prepend_scheme
      prepend_ = field.at("add_prefix_space").boolean() ? Prepend::always : Prepend::never;
    }
  } else if (type == "Sequence") {
    kind_ = Kind::sequence;
    const JsonField list = field.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      children_.push_back(std::make_unique<PreTokenizer>(list.at(i)));
  } else {
    field.unsupported(type, kImplemented);
  }
}

PreTokenizer::~PreTokenizer() = default;

bool PreTokenizer::ends_byte_level() const {
  if (kind_ == Kind::sequence) return !children_.empty() && children_.back()->ends_byte_level();
  return kind_ == Kind::byte_level;
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  if (kind_ == Kind::sequence) {
    for (const auto& child : children_) child->apply(pieces);
    return;
  }
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const Piece& piece : pieces) {
    if (piece.token >= 0) {
      out.push_back(piece);
    } else {
      apply_one(piece, out);
    }
  }
  pieces = std::move(out);
}

namespace {

// tokenizers' NormalizedString::split: the segments grouped per `behavior` (Removed drops the
// matches), each group a new piece; empty pieces are dropped.
template <class Behavior>
void split_into(const Piece& piece, std::vector<Segment> segments, Behavior behavior,
                Behavior removed, Behavior merged_with_previous, Behavior merged_with_next,
                Behavior contiguous, std::vector<Piece>& out) {
  struct Range {
    size_t begin, end;
    bool remove;
  };
  std::vector<Range> ranges;
  bool previous_match = false;
  if (behavior == merged_with_next) {
    for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
      if (it->is_match && !previous_match && !ranges.empty()) {
        ranges.back().begin = it->begin;
      } else {
        ranges.push_back({it->begin, it->end, false});
      }
      previous_match = it->is_match;
    }
    std::reverse(ranges.begin(), ranges.end());
  } else {
    for (const Segment& s : segments) {
      if (behavior == removed) {
        ranges.push_back({s.begin, s.end, s.is_match});
      } else if (behavior == contiguous && s.is_match == previous_match && !ranges.empty()) {
        ranges.back().end = s.end;
      } else if (behavior == merged_with_previous && s.is_match && !previous_match &&
                 !ranges.empty()) {
        ranges.back().end = s.end;
      } else {
        ranges.push_back({s.begin, s.end, false});
      }
      previous_match = s.is_match;
    }
  }
  for (const Range& r : ranges) {
    if (r.remove || r.end == r.begin) continue;
    out.push_back({piece.text.substr(r.begin, r.end - r.begin), piece.at_origin && r.begin == 0});
  }
}

}  // namespace

void PreTokenizer::apply_one(const Piece& piece, std::vector<Piece>& out) const {
  auto split = [&](std::vector<Segment> segments, Behavior behavior, const Piece& of) {
    split_into(of, std::move(segments), behavior, Behavior::removed, Behavior::merged_with_previous,
               Behavior::merged_with_next, Behavior::contiguous, out);
  };
  switch (kind_) {
    case Kind::split: {
      std::vector<Segment> segments = regex_segments(piece.text, *pattern_);
      if (invert_) {
        for (Segment& s : segments) s.is_match = !s.is_match;
      }
      // Isolated: every segment a piece of its own (tokenizers marks none for removal).
      if (behavior_ == Behavior::isolated) {
        for (Segment& s : segments) s.is_match = false;
      }
      split(std::move(segments), behavior_, piece);
      return;
    }
    case Kind::byte_level: {
      Piece p = piece;
      if (add_prefix_space_ && (p.text.empty() || p.text.front() != ' ')) p.text.insert(0, " ");
      std::vector<Piece> words;
      if (use_regex_) {
        std::vector<Segment> segments = regex_segments(p.text, *pattern_);
        for (Segment& s : segments) s.is_match = false;
        split_into(p, std::move(segments), Behavior::isolated, Behavior::removed,
                   Behavior::merged_with_previous, Behavior::merged_with_next, Behavior::contiguous,
                   words);
      } else if (!p.text.empty()) {
        words.push_back(std::move(p));
      }
      for (Piece& w : words) {
        std::string mapped;
        mapped.reserve(w.text.size() * 2);
        for (char c : w.text) mapped += byte_level_char(static_cast<unsigned char>(c));
        w.text = std::move(mapped);
        out.push_back(std::move(w));
      }
      return;
    }
    case Kind::digits: {
      split(char_segments(piece.text, unicode::is_numeric),
            individual_digits_ ? Behavior::isolated : Behavior::contiguous, piece);
      return;
    }
    case Kind::metaspace: {
      Piece p = piece;
      std::string replaced;
      replaced.reserve(p.text.size());
      for (char c : p.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced.push_back(c);
        }
      }
      p.text = std::move(replaced);
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::always || (prepend_ == Prepend::first && p.at_origin)))
        p.text.insert(0, replacement_);
      if (!split_) {
        if (!p.text.empty()) out.push_back(std::move(p));
        return;
      }
      const char32_t r = unicode::first_code_point(replacement_);
      split(char_segments(p.text, [r](char32_t c) { return c == r; }), Behavior::merged_with_next,
            p);
      return;
    }
    case Kind::sequence:
      break;
  }
}

}  // namespace moepeak::hf
