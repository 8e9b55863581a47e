// Fuzz target: a sharded checkpoint's manifest.json (files, blocks and their checksums, tensors
// and their slices), parsed and validated as --resume does before reading any shard.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/checkpoint/shard_manifest.h"  // defines: ShardManifest
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  fuzz::expect_accept_or_error([&] {
    (void)ShardManifest::parse(std::string_view(reinterpret_cast<const char*>(data), size),
                               "manifest.json");
  });
  return 0;
}
