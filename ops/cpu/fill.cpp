// CPU fill: a loop on the stream's worker.
#include <cstring>

#include "core/runtime/cpu_stream.h"
#include "ops/fill.h"

namespace moepeak::ops {

uint64_t fill_pattern(DType t, double value) {
  uint64_t bits = 0;
  switch (t) {
    case DType::f32: {
      float f = static_cast<float>(value);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case DType::bf16: bits = bf16::from_float(static_cast<float>(value)); break;
    case DType::f64: std::memcpy(&bits, &value, 8); break;
    case DType::i32: {
      int32_t i = static_cast<int32_t>(value);
      std::memcpy(&bits, &i, 4);
      break;
    }
    case DType::i64: {
      int64_t i = static_cast<int64_t>(value);
      std::memcpy(&bits, &i, 8);
      break;
    }
  }
  return bits;
}

void fill_cpu(const Tensor& out, double value, Stream& stream) {
  size_t elem = dtype_size(out.dtype());
  uint64_t pattern = fill_pattern(out.dtype(), value);
  char* p = static_cast<char*>(out.data());
  int64_t n = out.numel();
  as_cpu_stream(stream).enqueue([=] {
    for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * elem, &pattern, elem);
  });
}

}  // namespace moepeak::ops
