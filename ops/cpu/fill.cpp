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
    case DType::bf16:
      bits = bf16::from_float(static_cast<float>(value));
      break;
    case DType::f64:
      std::memcpy(&bits, &value, 8);
      break;
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
    if (pattern == 0) {  // zeroing gradients every step: the common case, at memset speed
      std::memset(p, 0, static_cast<size_t>(n) * elem);
      return;
    }
    auto typed = [&](auto word) {
      using Word = decltype(word);
      Word w;
      std::memcpy(&w, &pattern, sizeof(Word));
      Word* q = reinterpret_cast<Word*>(p);
      for (int64_t i = 0; i < n; ++i) q[i] = w;
    };
    switch (elem) {
      case 2:
        typed(uint16_t{});
        break;
      case 4:
        typed(uint32_t{});
        break;
      default:
        typed(uint64_t{});
        break;
    }
  });
}

}  // namespace moepeak::ops
