#include "core/metrics/flops.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/model/param_layout.h"
#include "ops/fill.h"
#include "ops/linear.h"

namespace moepeak {

double step_flops(const ModelConfig& model, int64_t batch, int64_t seq_len) {
  const double N = static_cast<double>(batch * seq_len);
  const ParamLayout& layout = cached_param_layout(model);
  const double active = static_cast<double>(layout.active_matmul_parameters());
  const double T = static_cast<double>(seq_len);
  const double causal_pairs = T * (T + 1) / 2;
  double layers = 0;  // sum over layers of the share of causal pairs each scores
  for (const LayerSpec& l : layout.spec().layers) {
    const int64_t W = l.attention.window;
    if (W == 0 || W >= seq_len) {
      layers += 1.0;
    } else {
      // sum_t min(t + 1, W) = W (W + 1) / 2 + (T - W) W
      const double w = static_cast<double>(W);
      layers += (w * (w + 1) / 2 + (T - w) * w) / causal_pairs;
    }
  }
  // Every layer's attention has the front layer's heads and widths (the decoder's one layout);
  // the spec's, not ModelConfig::head_dim: latent attention's q/k heads are nope + rope wide and
  // its value heads v_head_dim. Per causal (query, key) pair 2 (d + dv) forward and twice that
  // backward; 3 (d + dv) = 6 d for d = dv, bitwise (a factor of 2 is exact).
  const AttentionSpec& a = layout.spec().layers.front().attention;
  const double attention = 3.0 * static_cast<double>(batch) * layers *
                           static_cast<double>(a.heads) * T * T *
                           static_cast<double>(a.head_dim + a.value_dim());
  return 6.0 * N * active + attention;
}

double measure_cpu_gemm_gflops(DType dtype, int n, int repeats) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64, "GEMM ceiling for f32 or f64 only");
  const size_t count = static_cast<size_t>(n) * n;
  std::vector<double> a64, b64, c64;
  std::vector<float> a32, b32, c32;
  if (dtype == DType::f32) {
    a32.assign(count, 0.5f);
    b32.assign(count, 0.25f);
    c32.assign(count, 0.f);
  } else {
    a64.assign(count, 0.5);
    b64.assign(count, 0.25);
    c64.assign(count, 0.);
  }
  auto gemm = [&] {
    if (dtype == DType::f32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a32.data(), n, b32.data(),
                  n, 0.f, c32.data(), n);
    } else {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1., a64.data(), n, b64.data(),
                  n, 0., c64.data(), n);
    }
  };
  gemm();  // warm-up: thread pool, page faults
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * static_cast<double>(n) * n / best / 1e9;
}

double measure_backend_gemm_gflops(Backend& backend, DType dtype, int n, int repeats) {
  MOEPEAK_CHECK(n > 0 && repeats > 0, "GEMM ceiling: n and repeats must be positive, got ", n, ", ",
                repeats);
  Stream& stream = backend.default_stream();
  auto square = [&](double value, const char* what) {
    auto t = OwnedTensor::device(backend, Shape{n, n}, dtype, LiveSet::workspace, what);
    ops::fill(t, value, stream);
    return t;
  };
  const OwnedTensor x = square(0.01, "GEMM ceiling x"), w = square(0.01, "GEMM ceiling w"),
                    y = square(0.0, "GEMM ceiling y");
  std::unique_ptr<Event> start = backend.create_event(EventTiming::on),
                         end = backend.create_event(EventTiming::on);
  double best_ms = 1e30;
  for (int r = 0; r <= repeats; ++r) {  // r = 0: the untimed first run
    start->record(stream);
    ops::linear_forward(x, w, y, false, stream);
    end->record(stream);
    end->synchronize();
    if (r > 0) best_ms = std::min(best_ms, end->elapsed_ms(*start));
  }
  return 2.0 * n * static_cast<double>(n) * n / (best_ms * 1e-3) / 1e9;
}

}  // namespace moepeak
