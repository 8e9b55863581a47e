// CPU RMSNorm, forward and backward: one pass per row, statistics in double (see ops/rmsnorm.h);
// the forward multiplies by the weight in either NormWeightOrder.
// f32 | bf16 | f64 storage (ops/cpu/cpu_storage.h): elements are loaded into the compute type
// (fp32 for bf16) and every output element is stored (rounded) once; with bf16 storage dw may
// also be f32 (the fp32 main gradient, accumulated without a bf16 rounding).
#include "ops/rmsnorm.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

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
  const bool main_grad = x.dtype() == DType::bf16 && dw.dtype() == DType::f32;
  dw.expect(w.shape(), main_grad ? DType::f32 : x.dtype(),
            std::string(op) + ": dw (x's dtype, or f32 for bf16 x)");
}

void rmsnorm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                         const Tensor& rstd, Stream& stream, NormWeightOrder order) {
  const char* op = "rmsnorm_forward_cpu";
  check_rmsnorm_forward_args(op, x, w, eps, y, rstd);
  const bool after_cast = order == NormWeightOrder::weight_after_cast;
  int64_t rows = x.size(0), hidden = x.size(1);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* xp = x.data_as<T>();  // (N, H)
    const T* wp = w.data_as<T>();  // (H)
    T* yp = y.data_as<T>();        // (N, H)
    T* rp = rstd.data_as<T>();     // (N)
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < rows; ++n) {
        const T* xr = xp + n * hidden;
        double sum_sq = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          const double v = load(xr[h]);
          sum_sq += v * v;
        }
        double mean_sq = hidden > 0 ? sum_sq / static_cast<double>(hidden) : 0.0;
        // rstd in the compute type: stored rounded to bf16, but y uses the fp32 value.
        C r = static_cast<C>(1.0 / std::sqrt(mean_sq + eps));
        store(rp + n, r);
        T* yr = yp + n * hidden;
        if (after_cast) {
          // x_hat rounded to the storage dtype (a no-op for f32 and f64), then times w.
          for (int64_t h = 0; h < hidden; ++h) {
            store(yr + h, round_to_storage<T>(load(xr[h]) * r) * load(wp[h]));
          }
        } else {
          for (int64_t h = 0; h < hidden; ++h) store(yr + h, (load(xr[h]) * r) * load(wp[h]));
        }
      }
    });
  });
}

namespace {

// The backward on storage T with dw of type DW (T, or float for the fp32 main gradient of bf16
// storage).
template <typename T, typename DW>
void rmsnorm_backward_loop(const T* xp, const T* wp, const T* rp, const T* dyp, T* dxp, DW* dwp,
                           int64_t rows, int64_t hidden) {
  // Column sums of dy * xhat for dw, one double per hidden unit: scratch of the model's width,
  // not of the token count.
  thread_local std::vector<double> dw_sum;
  dw_sum.assign(static_cast<size_t>(hidden), 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    const T* xr = xp + n * hidden;
    const T* dyr = dyp + n * hidden;
    double r = load(rp[n]);  // the stored rstd (bf16-rounded for bf16 storage), as on CUDA
    // mean_h(g * xhat) with g = dy * w, xhat = x * rstd.
    double g_dot_xhat = 0;
    for (int64_t h = 0; h < hidden; ++h) {
      double xhat = static_cast<double>(load(xr[h])) * r;
      const double dyv = load(dyr[h]);
      g_dot_xhat += dyv * load(wp[h]) * xhat;
      dw_sum[h] += dyv * xhat;
    }
    double mean_g_xhat = hidden > 0 ? g_dot_xhat / static_cast<double>(hidden) : 0.0;
    T* dxr = dxp + n * hidden;
    for (int64_t h = 0; h < hidden; ++h) {
      double xhat = static_cast<double>(load(xr[h])) * r;
      double g = static_cast<double>(load(dyr[h])) * load(wp[h]);
      // Rounded to the compute type, then (bf16) to the storage type, as CUDA's store does.
      store(dxr + h, static_cast<compute_t<T>>(r * (g - xhat * mean_g_xhat)));
    }
  }
  // dw += the column sum rounded to dw's compute type: one rounding to bf16 per element for a
  // bf16 dw, none for an f32 dw.
  for (int64_t h = 0; h < hidden; ++h) {
    store(dwp + h, load(dwp[h]) + static_cast<compute_t<DW>>(dw_sum[h]));
  }
}

}  // namespace

void rmsnorm_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                          const Tensor& dx, const Tensor& dw, Stream& stream) {
  const char* op = "rmsnorm_backward_cpu";
  check_rmsnorm_backward_args(op, x, w, rstd, dy, dx, dw);
  int64_t rows = x.size(0), hidden = x.size(1);
  dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();     // (N, H)
    const T* wp = w.data_as<T>();     // (H)
    const T* rp = rstd.data_as<T>();  // (N)
    const T* dyp = dy.data_as<T>();   // (N, H)
    T* dxp = dx.data_as<T>();         // (N, H)
    // dw in x's dtype, or the fp32 main gradient beside bf16 (checked above).
    with_accumulator<T>(dw.dtype(), [&](auto dw_zero) {
      using DW = decltype(dw_zero);
      DW* dwp = dw.data_as<DW>();  // (H)
      as_cpu_stream(stream).enqueue(
          [=] { rmsnorm_backward_loop(xp, wp, rp, dyp, dxp, dwp, rows, hidden); });
    });
  });
}

}  // namespace moepeak::ops
