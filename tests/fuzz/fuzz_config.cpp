// Fuzz target: a TOML config through the schema (load_config, as `moepeak train -c FILE --set
// ...` reads it). The input is the file's text, then optionally a line "#--set" followed by one
// --set override per line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"  // defines: load_config
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t split = text.find("\n#--set\n");
  std::vector<std::string> overrides;
  if (split != std::string_view::npos) {
    std::string_view rest = text.substr(split + 8);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      overrides.emplace_back(rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
  }
  const std::string path = fuzz::write_scratch("config.toml", text.substr(0, split));
  fuzz::expect_accept_or_error([&] { (void)load_config({path}, overrides); });
  return 0;
}
