// Fuzz target: an llm.c token file (256 x int32 header: magic, version, token count) and the
// same bytes as a headerless uint16 and uint32 file; the first tokens of an accepted file are
// read.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/data/token_dataset.h"  // defines: open_token_bin
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string path = fuzz::write_scratch(
      "tokens.bin", std::string_view(reinterpret_cast<const char*>(data), size));
  for (TokenDtype t : {TokenDtype::llmc, TokenDtype::uint16, TokenDtype::uint32}) {
    fuzz::expect_accept_or_error([&] {
      const TokenDataset d = open_token_bin(path, t);
      std::vector<int64_t> ids(std::min<uint64_t>(d.token_count(), 4096));
      d.read_cyclic(0, ids.size(), ids.data(), 1 << 30);
    });
  }
  return 0;
}
