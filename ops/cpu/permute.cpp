// CPU gather / scatter-add / weighted combine of rows by an i32 index (see ops/permute.h).
#include "ops/permute.h"

#include <string>

#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {
namespace {

// The token-side tensor is (N, H) and the routed side (M, H) with index (M) i32, one float dtype.
void check_rows_args(const char* op, const Tensor& tokens, const char* tokens_name,
                     const Tensor& routed, const char* routed_name, const Tensor& index) {
  MOEPEAK_CHECK(tokens.ndim() == 2, op, ": ", tokens_name, " must be (N, H), got ", tokens.str());
  MOEPEAK_CHECK(index.ndim() == 1 && index.dtype() == DType::i32, op,
                ": index must be i32 (M), got ", index.str());
  routed.expect(Shape{index.size(0), tokens.size(1)}, tokens.dtype(),
                std::string(op) + ": " + routed_name);
}

// Throws naming the op, the position and the index unless every index is in [0, rows).
void check_indices(const char* op, const int32_t* index, int64_t count, int64_t rows) {
  for (int64_t i = 0; i < count; ++i) {
    if (index[i] < 0 || index[i] >= rows) {
      MOEPEAK_THROW(op, ": index ", index[i], " at position ", i, " is outside [0, ", rows, ")");
    }
  }
}

}  // namespace

void check_gather_rows_args(const char* op, const Tensor& src, const Tensor& index,
                            const Tensor& dst) {
  check_rows_args(op, src, "src", dst, "dst", index);
}

void check_scatter_add_rows_args(const char* op, const Tensor& src, const Tensor& index,
                                 const Tensor& dst) {
  check_rows_args(op, dst, "dst", src, "src", index);
}

void check_combine_rows_args(const char* op, const Tensor& y, const Tensor& index,
                             const Tensor& weight, const Tensor& out) {
  check_rows_args(op, out, "out", y, "y", index);
  weight.expect(index.shape(), out.dtype(), std::string(op) + ": weight");
}

void check_combine_rows_backward_args(const char* op, const Tensor& dout, const Tensor& y,
                                      const Tensor& index, const Tensor& weight, const Tensor& dy,
                                      const Tensor& dweight) {
  check_rows_args(op, dout, "dout", y, "y", index);
  weight.expect(index.shape(), dout.dtype(), std::string(op) + ": weight");
  dy.expect(y.shape(), dout.dtype(), std::string(op) + ": dy");
  dweight.expect(index.shape(), dout.dtype(), std::string(op) + ": dweight");
}

void gather_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream) {
  const char* op = "gather_rows_cpu";
  check_gather_rows_args(op, src, index, dst);
  dispatch_float(src.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* sp = src.data_as<T>();                // (N, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    T* dp = dst.data_as<T>();                      // (M, H)
    int64_t rows = src.size(0), routed = index.size(0), hidden = src.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* from = sp + static_cast<int64_t>(ip[i]) * hidden;
        T* to = dp + i * hidden;
        for (int64_t h = 0; h < hidden; ++h) to[h] = from[h];
      }
    });
  });
}

void scatter_add_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst,
                          Stream& stream) {
  const char* op = "scatter_add_rows_cpu";
  check_scatter_add_rows_args(op, src, index, dst);
  dispatch_float(dst.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* sp = src.data_as<T>();                // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    T* dp = dst.data_as<T>();                      // (N, H)
    int64_t rows = dst.size(0), routed = index.size(0), hidden = dst.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* from = sp + i * hidden;
        T* to = dp + static_cast<int64_t>(ip[i]) * hidden;
        for (int64_t h = 0; h < hidden; ++h) to[h] += from[h];
      }
    });
  });
}

void combine_rows_cpu(const Tensor& y, const Tensor& index, const Tensor& weight, const Tensor& out,
                      Stream& stream) {
  const char* op = "combine_rows_cpu";
  check_combine_rows_args(op, y, index, weight, out);
  dispatch_float(out.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* yp = y.data_as<T>();                  // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    const T* wp = weight.data_as<T>();             // (M)
    T* outp = out.data_as<T>();                    // (N, H)
    int64_t rows = out.size(0), routed = index.size(0), hidden = out.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* from = yp + i * hidden;
        T* to = outp + static_cast<int64_t>(ip[i]) * hidden;
        for (int64_t h = 0; h < hidden; ++h) to[h] += wp[i] * from[h];
      }
    });
  });
}

void combine_rows_backward_cpu(const Tensor& dout, const Tensor& y, const Tensor& index,
                               const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                               Stream& stream) {
  const char* op = "combine_rows_backward_cpu";
  check_combine_rows_backward_args(op, dout, y, index, weight, dy, dweight);
  dispatch_float(dout.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* doutp = dout.data_as<T>();            // (N, H)
    const T* yp = y.data_as<T>();                  // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    const T* wp = weight.data_as<T>();             // (M)
    T* dyp = dy.data_as<T>();                      // (M, H)
    T* dwp = dweight.data_as<T>();                 // (M)
    int64_t rows = dout.size(0), routed = index.size(0), hidden = dout.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* g = doutp + static_cast<int64_t>(ip[i]) * hidden;
        const T* yr = yp + i * hidden;
        T* dyr = dyp + i * hidden;
        double dot = 0;
        for (int64_t h = 0; h < hidden; ++h) dot += static_cast<double>(g[h]) * yr[h];
        // dy may alias y (the expert output is no longer needed): y[i] is read above first.
        for (int64_t h = 0; h < hidden; ++h) dyr[h] = wp[i] * g[h];
        dwp[i] = static_cast<T>(dot);
      }
    });
  });
}

}  // namespace moepeak::ops
