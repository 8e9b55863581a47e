// Fuzz target: a Hugging Face config.json as `moepeak train --init-from DIR` reads it
// (with_init_from_model: read_config_json, then every [model] key set and range-checked from it
// and the cross-key rules of check_config).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/checkpoint/hf_import.h"  // defines: with_init_from_model
#include "core/config/config.h"         // defines: load_config
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  fuzz::write_scratch("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  static const Config base =
      load_config({}, {"model.init_from=\"" + fuzz::scratch_dir().string() + "\""});
  fuzz::expect_accept_or_error([&] { (void)with_init_from_model(base); });
  return 0;
}
