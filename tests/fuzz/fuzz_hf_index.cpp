// Fuzz target: a Hugging Face model.safetensors.index.json (the weight map of a sharded
// checkpoint), opened as model.init_from opens a directory; the directory also holds one small
// valid safetensors file, model-00001-of-00001.safetensors, for the index to name.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/checkpoint/hf_import.h"  // defines: HfCheckpoint
#include "tests/fuzz/fuzz_input.h"

namespace {

// A safetensors file of one F32 tensor "t" of shape (2).
std::string small_safetensors() {
  const std::string header = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(8, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moepeak;
  if (size > fuzz::kMaxInputBytes) return 0;
  static const std::string weights =
      fuzz::write_scratch("model-00001-of-00001.safetensors", small_safetensors());
  (void)weights;
  fuzz::write_scratch("model.safetensors.index.json",
                      std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_accept_or_error([&] {
    const HfCheckpoint hf(fuzz::scratch_dir().string());
    (void)hf.tensor_names();
  });
  return 0;
}
