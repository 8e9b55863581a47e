// A tokenizer.json normalizer: see hf_normalizer.h.
#include "core/prepare/hf_normalizer.h"

namespace moepeak::hf {

namespace {

const char* const kImplemented = "NFC, NFD, NFKC, NFKD, Sequence, Prepend, Replace";

}  // namespace

Normalizer::Normalizer(const JsonField& field) {
  const std::string type = field.at("type").string();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    kind_ = Kind::form;
    form_ = type == "NFC"    ? unicode::NormalForm::nfc
            : type == "NFD"  ? unicode::NormalForm::nfd
            : type == "NFKC" ? unicode::NormalForm::nfkc
                             : unicode::NormalForm::nfkd;
  } else if (type == "Sequence") {
    kind_ = Kind::sequence;
    const JsonField list = field.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      children_.push_back(std::make_unique<Normalizer>(list.at(i)));
  } else if (type == "Prepend") {
    kind_ = Kind::prepend;
    text_ = field.at("prepend").string();
  } else if (type == "Replace") {
    kind_ = Kind::replace;
    pattern_ = pattern_of(field.at("pattern"));
    text_ = field.at("content").string();
  } else {
    field.unsupported(type, kImplemented);
  }
}

Normalizer::~Normalizer() = default;

void Normalizer::apply(std::string& text) const {
  switch (kind_) {
    case Kind::form:
      text = unicode::normalize(text, form_);
      return;
    case Kind::sequence:
      for (const auto& child : children_) child->apply(text);
      return;
    case Kind::prepend:
      if (!text.empty()) text.insert(0, text_);
      return;
    case Kind::replace: {
      std::string out;
      size_t kept = 0;
      pattern_->find_all(text, [&](size_t begin, size_t end) {
        out.append(text, kept, begin - kept);
        out += text_;
        kept = end;
      });
      out.append(text, kept, std::string::npos);
      text = std::move(out);
      return;
    }
  }
}

}  // namespace moepeak::hf
