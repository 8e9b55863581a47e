// Fuzz target: a Megatron indexed dataset's .idx (magic, version, dtype code, counts, sizes,
// pointers, document index) beside a fixed 4 KiB .bin; the first tokens of an accepted dataset
// are read, and its document starts in two ranges (one wrapping past the end).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/token_dataset.h"  // defines: open_megatron_dataset
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  static const std::string bin = fuzz::write_scratch("data.bin", std::string(4096, '\1'));
  fuzz::write_scratch("data.idx", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_accept_or_error([&] {
    const TokenDataset d = open_megatron_dataset(bin);
    std::vector<int64_t> ids(std::min<uint64_t>(d.token_count(), 4096));
    d.read_cyclic(0, ids.size(), ids.data(), 1 << 30);
    std::vector<int64_t> starts;
    d.document_starts(0, ids.size(), starts);
    d.document_starts(d.token_count() / 2 + 1, ids.size(), starts);
  });
  return 0;
}
