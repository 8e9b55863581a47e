// CPU element-wise helpers: add, in-place scale, sum of squares (double, index order), copy,
// per-row scale and dot (see ops/elementwise.h).
#include "ops/elementwise.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {

void check_add_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) {
  b.expect(a.shape(), a.dtype(), std::string(op) + ": b (like a " + a.str() + ")");
  out.expect(a.shape(), a.dtype(), std::string(op) + ": out (like a " + a.str() + ")");
}

void check_sum_squares_args(const char* op, const Tensor& out) {
  MOEPEAK_CHECK(out.ndim() == 1 && out.size(0) >= 1 && out.dtype() == DType::f64, op,
                ": out must be (P) f64 with P >= 1 partial sums, got ", out.str());
}

void check_copy_args(const char* op, const Tensor& src, const Tensor& dst) {
  dst.expect(src.shape(), src.dtype(), std::string(op) + ": dst (like src " + src.str() + ")");
}

void check_scale_rows_args(const char* op, const Tensor& x, const Tensor& weight) {
  MOEPEAK_CHECK(x.ndim() == 2, op, ": x must be (M, C), got ", x.str());
  weight.expect(Shape{x.size(0)}, x.dtype(), std::string(op) + ": weight (for x " + x.str() + ")");
}

void check_row_dot_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) {
  MOEPEAK_CHECK(a.ndim() == 2, op, ": a must be (M, C), got ", a.str());
  b.expect(a.shape(), a.dtype(), std::string(op) + ": b (like a " + a.str() + ")");
  out.expect(Shape{a.size(0)}, a.dtype(), std::string(op) + ": out (for a " + a.str() + ")");
}

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream) {
  const char* op = "add_cpu";
  check_add_args(op, a, b, out);
  dispatch_float(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    T* outp = out.data_as<T>();  // may be ap or bp
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < n; ++i) outp[i] = ap[i] + bp[i];
    });
  });
}

void scale_cpu(const Tensor& x, double alpha, Stream& stream) {
  dispatch_float(x.dtype(), "scale_cpu", [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();
    T factor = static_cast<T>(alpha);
    int64_t n = x.numel();
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < n; ++i) xp[i] *= factor;
    });
  });
}

void sum_squares_cpu(const Tensor& x, const Tensor& out, Stream& stream) {
  const char* op = "sum_squares_cpu";
  check_sum_squares_args(op, out);
  dispatch_float(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();
    double* outp = out.data_as<double>();
    const int64_t n = x.numel(), parts = out.size(0), c = (n + parts - 1) / parts;
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t p = 0; p < parts && p * c < n; ++p) {
        double sum = 0;
        for (int64_t i = p * c; i < std::min(n, (p + 1) * c); ++i) {
          sum += static_cast<double>(xp[i]) * xp[i];
        }
        outp[p] += sum;
      }
    });
  });
}

void copy_cpu(const Tensor& src, const Tensor& dst, Stream& stream) {
  check_copy_args("copy_cpu", src, dst);
  const void* from = src.data();
  void* to = dst.data();
  size_t bytes = src.nbytes();
  as_cpu_stream(stream).enqueue([=] {
    if (bytes > 0 && from != to) std::memmove(to, from, bytes);
  });
}

void scale_rows_cpu(const Tensor& x, const Tensor& weight, Stream& stream) {
  const char* op = "scale_rows_cpu";
  check_scale_rows_args(op, x, weight);
  dispatch_float(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();             // (M, C)
    const T* wp = weight.data_as<T>();  // (M)
    const int64_t rows = x.size(0), cols = x.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < cols; ++c) xp[i * cols + c] *= wp[i];
      }
    });
  });
}

void row_dot_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                 Stream& stream) {
  const char* op = "row_dot_cpu";
  check_row_dot_args(op, a, b, out);
  dispatch_float(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();  // (M, C)
    const T* bp = b.data_as<T>();  // (M, C)
    T* outp = out.data_as<T>();    // (M)
    const int64_t rows = a.size(0), cols = a.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < rows; ++i) {
        double dot = 0;
        for (int64_t c = 0; c < cols; ++c) {
          dot += static_cast<double>(ap[i * cols + c]) * bp[i * cols + c];
        }
        outp[i] = accumulate ? outp[i] + static_cast<T>(dot) : static_cast<T>(dot);
      }
    });
  });
}

}  // namespace moepeak::ops
