// CPU RMSNorm, forward and backward: one pass per row, statistics in double (see ops/rmsnorm.h).
#include "ops/rmsnorm.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {
namespace {

// x: (N, H) float; w: (H) of x's dtype. Returns nothing; throws naming `op` on a mismatch.
void check_x_and_w(const char* op, const Tensor& x, const Tensor& w) {
  MOEPEAK_CHECK(x.ndim() == 2, op, ": x must be (N, H), got ", x.str());
  w.expect(Shape{x.size(1)}, x.dtype(), std::string(op) + ": w");
}

}  // namespace

void check_rmsnorm_forward_args(const char* op, const Tensor& x, const Tensor& w, double eps,
                                const Tensor& y, const Tensor& rstd) {
  check_x_and_w(op, x, w);
  MOEPEAK_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  y.expect(x.shape(), x.dtype(), std::string(op) + ": y");
  rstd.expect(Shape{x.size(0)}, x.dtype(), std::string(op) + ": rstd");
}

void check_rmsnorm_backward_args(const char* op, const Tensor& x, const Tensor& w,
                                 const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                 const Tensor& dw) {
  check_x_and_w(op, x, w);
  rstd.expect(Shape{x.size(0)}, x.dtype(), std::string(op) + ": rstd");
  dy.expect(x.shape(), x.dtype(), std::string(op) + ": dy");
  dx.expect(x.shape(), x.dtype(), std::string(op) + ": dx");
  dw.expect(w.shape(), x.dtype(), std::string(op) + ": dw");
}

void rmsnorm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                         const Tensor& rstd, Stream& stream) {
  const char* op = "rmsnorm_forward_cpu";
  check_rmsnorm_forward_args(op, x, w, eps, y, rstd);
  int64_t rows = x.size(0), hidden = x.size(1);
  dispatch_float(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();  // (N, H)
    const T* wp = w.data_as<T>();  // (H)
    T* yp = y.data_as<T>();        // (N, H)
    T* rp = rstd.data_as<T>();     // (N)
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < rows; ++n) {
        const T* xr = xp + n * hidden;
        double sum_sq = 0;
        for (int64_t h = 0; h < hidden; ++h) sum_sq += static_cast<double>(xr[h]) * xr[h];
        double mean_sq = hidden > 0 ? sum_sq / static_cast<double>(hidden) : 0.0;
        T r = static_cast<T>(1.0 / std::sqrt(mean_sq + eps));
        rp[n] = r;
        T* yr = yp + n * hidden;
        for (int64_t h = 0; h < hidden; ++h) yr[h] = (xr[h] * r) * wp[h];
      }
    });
  });
}

void rmsnorm_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                          const Tensor& dx, const Tensor& dw, Stream& stream) {
  const char* op = "rmsnorm_backward_cpu";
  check_rmsnorm_backward_args(op, x, w, rstd, dy, dx, dw);
  int64_t rows = x.size(0), hidden = x.size(1);
  dispatch_float(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();     // (N, H)
    const T* wp = w.data_as<T>();     // (H)
    const T* rp = rstd.data_as<T>();  // (N)
    const T* dyp = dy.data_as<T>();   // (N, H)
    T* dxp = dx.data_as<T>();         // (N, H)
    T* dwp = dw.data_as<T>();         // (H)
    as_cpu_stream(stream).enqueue([=] {
      // Column sums of dy * xhat for dw, one double per hidden unit: scratch of the model's width,
      // not of the token count.
      thread_local std::vector<double> dw_sum;
      dw_sum.assign(static_cast<size_t>(hidden), 0.0);
      for (int64_t n = 0; n < rows; ++n) {
        const T* xr = xp + n * hidden;
        const T* dyr = dyp + n * hidden;
        double r = rp[n];
        // mean_h(g * xhat) with g = dy * w, xhat = x * rstd.
        double g_dot_xhat = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          double xhat = static_cast<double>(xr[h]) * r;
          g_dot_xhat += static_cast<double>(dyr[h]) * wp[h] * xhat;
          dw_sum[h] += static_cast<double>(dyr[h]) * xhat;
        }
        double mean_g_xhat = hidden > 0 ? g_dot_xhat / static_cast<double>(hidden) : 0.0;
        T* dxr = dxp + n * hidden;
        for (int64_t h = 0; h < hidden; ++h) {
          double xhat = static_cast<double>(xr[h]) * r;
          double g = static_cast<double>(dyr[h]) * wp[h];
          dxr[h] = static_cast<T>(r * (g - xhat * mean_g_xhat));
        }
      }
      for (int64_t h = 0; h < hidden; ++h) dwp[h] += static_cast<T>(dw_sum[h]);
    });
  });
}

}  // namespace moepeak::ops
