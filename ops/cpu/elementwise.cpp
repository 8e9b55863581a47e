// CPU element-wise helpers: add, in-place scale, sum of squares (double, index order), copy,
// per-row scale and dot (see ops/elementwise.h). f32 | bf16 | f64 storage (ops/cpu/cpu_storage.h):
// each element is loaded into the compute type, and every output is stored (rounded) once.
#include "ops/elementwise.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

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
  const bool f32_out = a.dtype() == DType::bf16 && out.dtype() == DType::f32;
  out.expect(Shape{a.size(0)}, f32_out ? DType::f32 : a.dtype(),
             std::string(op) + ": out (for a " + a.str() + ")");
}

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream) {
  const char* op = "add_cpu";
  check_add_args(op, a, b, out);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    T* outp = out.data_as<T>();  // may be ap or bp
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < n; ++i) store(outp + i, load(ap[i]) + load(bp[i]));
    });
  });
}

void scale_cpu(const Tensor& x, double alpha, Stream& stream) {
  dispatch_storage(x.dtype(), "scale_cpu", [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();
    // alpha is rounded to the compute type (fp32 for bf16 storage, not to bf16), as on CUDA.
    compute_t<T> factor = static_cast<compute_t<T>>(alpha);
    int64_t n = x.numel();
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < n; ++i) store(xp + i, load(xp[i]) * factor);
    });
  });
}

void sum_squares_cpu(const Tensor& x, const Tensor& out, Stream& stream) {
  const char* op = "sum_squares_cpu";
  check_sum_squares_args(op, out);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();
    double* outp = out.data_as<double>();
    const int64_t n = x.numel(), parts = out.size(0), c = (n + parts - 1) / parts;
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t p = 0; p < parts && p * c < n; ++p) {
        double sum = 0;
        for (int64_t i = p * c; i < std::min(n, (p + 1) * c); ++i) {
          const double v = load(xp[i]);
          sum += v * v;
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
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* xp = x.data_as<T>();             // (M, C)
    const T* wp = weight.data_as<T>();  // (M)
    const int64_t rows = x.size(0), cols = x.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < rows; ++i) {
        const compute_t<T> factor = load(wp[i]);
        for (int64_t c = 0; c < cols; ++c) {
          store(xp + i * cols + c, load(xp[i * cols + c]) * factor);
        }
      }
    });
  });
}

void row_dot_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                 Stream& stream) {
  const char* op = "row_dot_cpu";
  check_row_dot_args(op, a, b, out);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();  // (M, C)
    const T* bp = b.data_as<T>();  // (M, C)
    const int64_t rows = a.size(0), cols = a.size(1);
    auto run = [=](auto* outp) {  // (M): T, or float beside bf16
      for (int64_t i = 0; i < rows; ++i) {
        double dot = 0;
        for (int64_t c = 0; c < cols; ++c) {
          dot += static_cast<double>(load(ap[i * cols + c])) * load(bp[i * cols + c]);
        }
        // Rounded to the compute type, added in it, and stored (rounded to bf16) once.
        const compute_t<T> d = static_cast<compute_t<T>>(dot);
        store(outp + i, accumulate ? load(outp[i]) + d : d);
      }
    };
    if (out.dtype() != a.dtype()) {
      float* outp = out.data_as<float>();
      as_cpu_stream(stream).enqueue([=] { run(outp); });
    } else {
      T* outp = out.data_as<T>();
      as_cpu_stream(stream).enqueue([=] { run(outp); });
    }
  });
}

}  // namespace moepeak::ops
