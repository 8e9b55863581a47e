// CPU copy_2d (ops/copy_2d.h): one memcpy per row on the stream's thread, and the argument checks
// both backends share. Test: ctest -R test_backend_ops_cpu, ctest -R ulysses
#include "ops/copy_2d.h"

#include <cstring>

#include "core/error.h"
#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {

void check_copy_2d_args(const char* op, const Tensor& src, Block2d from, const Tensor& dst,
                        Block2d to, int64_t rows, int64_t width) {
  MOEPEAK_CHECK(src.dtype() == dst.dtype(), op, ": src is ", dtype_name(src.dtype()), ", dst is ",
                dtype_name(dst.dtype()));
  MOEPEAK_CHECK(rows >= 0 && width >= 0, op, ": ", rows, " rows of ", width, " elements");
  if (rows == 0 || width == 0) return;
  auto check_side = [&](const char* side, const Tensor& t, Block2d b) {
    MOEPEAK_CHECK(b.offset >= 0 && b.pitch >= width, op, ": ", side, " offset ", b.offset,
                  " and pitch ", b.pitch, " for rows of ", width,
                  " elements (offset >= 0 and pitch >= width expected)");
    const int64_t last = b.offset + (rows - 1) * b.pitch + width;
    MOEPEAK_CHECK(last <= t.numel(), op, ": ", side, " block of ", rows, " x ", width,
                  " elements at offset ", b.offset, ", pitch ", b.pitch, " ends at element ", last,
                  " but ", side, " holds ", t.numel());
  };
  check_side("src", src, from);
  check_side("dst", dst, to);
}

void copy_2d_cpu(const Tensor& src, Block2d from, const Tensor& dst, Block2d to, int64_t rows,
                 int64_t width, Stream& stream) {
  check_copy_2d_args("copy_2d_cpu", src, from, dst, to, rows, width);
  if (rows == 0 || width == 0) return;
  const size_t es = dtype_size(src.dtype());
  const char* in = static_cast<const char*>(src.data()) + static_cast<size_t>(from.offset) * es;
  char* out = static_cast<char*>(dst.data()) + static_cast<size_t>(to.offset) * es;
  const size_t in_pitch = static_cast<size_t>(from.pitch) * es;
  const size_t out_pitch = static_cast<size_t>(to.pitch) * es;
  const size_t row_bytes = static_cast<size_t>(width) * es;
  as_cpu_stream(stream).enqueue([=] {
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(out + static_cast<size_t>(i) * out_pitch, in + static_cast<size_t>(i) * in_pitch,
                  row_bytes);
    }
  });
}

}  // namespace moepeak::ops
