// Fuzz target: a safetensors file (header length, JSON header, data offsets), opened as a
// checkpoint's weights are, then every tensor it accepts read whole.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/checkpoint/safetensors.h"  // defines: SafetensorsFile
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string path = fuzz::write_scratch(
      "model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_accept_or_error([&] {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const std::string& name : file.names()) {
      std::vector<char> bytes(file.info(name).bytes);
      file.read(name, bytes.data(), bytes.size());
    }
  });
  return 0;
}
