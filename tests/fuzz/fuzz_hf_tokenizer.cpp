// Fuzz target: a tokenizer.json as `moepeak data prepare --tokenizer` reads it (hf::Tokenizer),
// then encoding a fixed text in several scripts and, when the input is valid UTF-8, the input
// itself. Every id it gives must be below the vocabulary size it reports (the dataset's token
// type is chosen by that size).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/prepare/hf_tokenizer.h"
#include "core/prepare/unicode_text.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string path = fuzz::write_scratch("tokenizer.json", bytes);
  fuzz::expect_accept_or_error([&] {
    const hf::Tokenizer tokenizer(path);
    std::vector<int32_t> ids;
    tokenizer.encode(
        "Hello, wörld 123 — Ελληνικά, русский, 中文, 日本語 🙂\n\tend",
        ids);
    if (unicode::first_invalid_utf8(bytes) == std::string_view::npos) tokenizer.encode(bytes, ids);
    for (int32_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
    }
  });
  return 0;
}
