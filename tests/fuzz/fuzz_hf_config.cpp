// Fuzz target: a Hugging Face config.json read into the model's settings (model.init_from).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/checkpoint/hf_config.h"  // defines: read_config_json
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string path = fuzz::write_scratch(
      "config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_accept_or_error([&] { (void)read_config_json(path); });
  return 0;
}
