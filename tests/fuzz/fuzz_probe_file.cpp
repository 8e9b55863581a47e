// Fuzz target: the probe file `moepeak probe` writes and `runtime.probe_file` reads (TOML:
// topology, link bench, per-rank budgets).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_input.h"
#include "topology/probe_file.h"  // defines: read_probe_file

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string path = fuzz::write_scratch(
      "probe.toml", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_accept_or_error([&] { (void)topology::read_probe_file(path); });
  return 0;
}
