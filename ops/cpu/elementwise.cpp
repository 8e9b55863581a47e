// CPU element-wise helpers: add, in-place scale, sum of squares (double, index order), copy
// (see ops/elementwise.h).
#include "ops/elementwise.h"

#include <cstring>
#include <string>

#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream) {
  const char* op = "add_cpu";
  b.expect(a.shape(), a.dtype(), std::string(op) + ": b (like a " + a.str() + ")");
  out.expect(a.shape(), a.dtype(), std::string(op) + ": out (like a " + a.str() + ")");
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
  out.expect(Shape{1}, DType::f64, std::string(op) + ": out");
  dispatch_float(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();
    double* outp = out.data_as<double>();
    int64_t n = x.numel();
    as_cpu_stream(stream).enqueue([=] {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xp[i]) * xp[i];
      outp[0] += sum;
    });
  });
}

void copy_cpu(const Tensor& src, const Tensor& dst, Stream& stream) {
  dst.expect(src.shape(), src.dtype(), "copy_cpu: dst (like src " + src.str() + ")");
  const void* from = src.data();
  void* to = dst.data();
  size_t bytes = src.nbytes();
  as_cpu_stream(stream).enqueue([=] {
    if (bytes > 0 && from != to) std::memmove(to, from, bytes);
  });
}

}  // namespace moepeak::ops
