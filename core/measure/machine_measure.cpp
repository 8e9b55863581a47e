// measure_machine_rates: this rank's rates at a config's shapes (see machine_measure.h).
#include "core/measure/machine_measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/measure/harness.h"
#include "core/metrics/flops.h"
#include "core/model/param_layout.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/grouped_linear.h"
#include "ops/linear.h"
#include "ops/schedules/schedule_dtype.h"
#include "ops/swiglu.h"

namespace moepeak::measure {
namespace {

OwnedTensor seeded(Backend& backend, Shape shape, DType dtype, std::mt19937& rng) {
  OwnedTensor t = OwnedTensor::device(backend, shape, dtype, LiveSet::workspace, "rate input");
  std::uniform_real_distribution<double> uni(-0.5, 0.5);
  fill_seeded(t, backend, [&] { return uni(rng); });
  return t;
}

// Seconds of `work` on the default stream: the median of `repeats` after one warm-up.
template <typename F>
double seconds(Backend& backend, int repeats, F&& work) {
  EventTimer timer(backend);
  return timer.median_ms(1, repeats, work) / 1e3;
}

// FLOP/s of y = x w^T (M x K by N x K) forward and backward, for each (N, K) in `shapes`.
double gemm_rate(Backend& backend, DType dtype, int64_t M, const std::vector<Shape>& weights,
                 int repeats, std::mt19937& rng) {
  double flops = 0, time = 0;
  for (const Shape& w_shape : weights) {
    const int64_t N = w_shape[0], K = w_shape[1];
    OwnedTensor x = seeded(backend, Shape{M, K}, dtype, rng);
    OwnedTensor w = seeded(backend, w_shape, dtype, rng);
    OwnedTensor y = seeded(backend, Shape{M, N}, dtype, rng);
    OwnedTensor dx = seeded(backend, Shape{M, K}, dtype, rng);
    OwnedTensor dw = seeded(backend, w_shape, schedules::main_grad_dtype(dtype), rng);
    time += seconds(backend, repeats, [&](Stream& s) {
      ops::linear_forward(x, w, y, false, s);
      ops::linear_backward(x, w, y, dx, false, dw, s);
    });
    flops += 6.0 * static_cast<double>(M) * N * K;
  }
  return flops / time;
}

}  // namespace

MachineRates measure_machine_rates(Backend& backend, const Config& cfg, const PlanInputs& in,
                                   int repeats) {
  const ModelConfig& m = cfg.model;
  const ParallelDegrees& d = in.degrees;
  const DType dtype = in.dtype;
  const DecoderSpec& spec = cached_param_layout(m).spec();
  const AttentionSpec& a = spec.layers.front().attention;
  const int64_t N = in.batch * in.seq_len / d.world, H = m.hidden_size;
  std::mt19937 rng(1234);
  MachineRates r;
  const bool cuda = backend.kind() == BackendKind::cuda;
  r.name = cuda ? "this GPU (measured at the config's shapes)"
                : "this CPU (measured at the config's shapes)";
  r.source = "measured now";

  // The dense GEMMs: the q projection, the output projection and the LM head.
  r.gemm_flops = gemm_rate(
      backend, dtype, N,
      {Shape{a.heads * a.head_dim, H}, Shape{H, a.heads * a.value_dim()}, Shape{m.vocab_size, H}},
      repeats, rng);

  // The experts' w1 over this rank's experts, N k rows split evenly.
  {
    const int64_t E = std::max<int64_t>(1, m.num_local_experts / d.expert);
    const int64_t F = m.expert_intermediate_size();
    const int64_t rows = std::max<int64_t>(E, N * m.num_experts_per_tok);
    std::vector<OwnedTensor> w, dw;
    std::vector<Tensor> wv, dwv;
    std::vector<int64_t> offsets(1, 0);
    for (int64_t e = 0; e < E; ++e) {
      w.push_back(seeded(backend, Shape{F, H}, dtype, rng));
      dw.push_back(seeded(backend, Shape{F, H}, schedules::main_grad_dtype(dtype), rng));
      wv.push_back(w.back());
      dwv.push_back(dw.back());
      offsets.push_back(rows * (e + 1) / E);
    }
    OwnedTensor x = seeded(backend, Shape{rows, H}, dtype, rng);
    OwnedTensor y = seeded(backend, Shape{rows, F}, dtype, rng);
    OwnedTensor dx = seeded(backend, Shape{rows, H}, dtype, rng);
    const double time = seconds(backend, repeats, [&](Stream& s) {
      ops::grouped_linear_forward(x, wv, offsets, y, false, s);
      ops::grouped_linear_backward(x, wv, offsets, y, dx, false, dwv, s);
    });
    r.grouped_gemm_flops = 6.0 * static_cast<double>(rows) * F * H / time;
  }

  // The first layer's attention in the head layout.
  {
    const int64_t B = in.batch / d.sequence_groups(), T = in.seq_len;
    const int64_t nh = std::max<int64_t>(1, a.heads / d.sequence);
    const int64_t nkv = std::max<int64_t>(1, a.kv_heads / d.sequence);
    const int64_t dq = a.head_dim, dv = a.value_dim();
    OwnedTensor q = seeded(backend, Shape{B, T, nh, dq}, dtype, rng);
    OwnedTensor k = seeded(backend, Shape{B, T, nkv, dq}, dtype, rng);
    OwnedTensor v = seeded(backend, Shape{B, T, nkv, dv}, dtype, rng);
    OwnedTensor out = seeded(backend, Shape{B, T, nh, dv}, dtype, rng);
    OwnedTensor lse = OwnedTensor::device(backend, Shape{B, nh, T}, ops::attention_lse_dtype(dtype),
                                          LiveSet::workspace, "rate lse");
    OwnedTensor dq_t = seeded(backend, Shape{B, T, nh, dq}, dtype, rng);
    OwnedTensor dk_t = seeded(backend, Shape{B, T, nkv, dq}, dtype, rng);
    OwnedTensor dv_t = seeded(backend, Shape{B, T, nkv, dv}, dtype, rng);
    ops::AttentionVariant variant;
    variant.window = a.window;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dq));
    const double time = seconds(backend, repeats, [&](Stream& s) {
      ops::attention_forward(q, k, v, scale, variant, out, lse, s);
      ops::attention_backward(q, k, v, out, lse, out, scale, variant, dq_t, dk_t, dv_t, Tensor(),
                              s);
    });
    const double t = static_cast<double>(T), w = static_cast<double>(a.window);
    const double pairs =
        a.window == 0 || a.window >= T ? t * (t + 1) / 2 : w * (w + 1) / 2 + (t - w) * w;
    // forward 2 (dq + dv) per pair and head, backward 2.5x (step_time.h)
    r.attention_flops = 3.5 * 2 * static_cast<double>(B * nh * (dq + dv)) * pairs / time;
  }

  // Device memory: a + b -> out over at least 2^22 elements.
  {
    const int64_t n = std::max<int64_t>(N * H, int64_t{1} << 22);
    OwnedTensor x = seeded(backend, Shape{n}, dtype, rng);
    OwnedTensor y = seeded(backend, Shape{n}, dtype, rng);
    OwnedTensor z = seeded(backend, Shape{n}, dtype, rng);
    const double time = seconds(backend, repeats, [&](Stream& s) { ops::add(x, y, z, s); });
    r.memory_bytes_per_s = 3.0 * static_cast<double>(n) * dtype_size(dtype) / time;
  }

  // The layers' elementwise ops, priced by the SwiGLU (its exponentials bound it on a CPU):
  // forward and backward over the rows the rank's experts activate, at most 2^22 elements.
  {
    const int64_t F = m.expert_intermediate_size();
    const int64_t rows = std::clamp<int64_t>(N * m.num_experts_per_tok, 1,
                                             std::max<int64_t>(1, (int64_t{1} << 22) / F));
    std::vector<OwnedTensor> t;
    for (int i = 0; i < 6; ++i) t.push_back(seeded(backend, Shape{rows, F}, dtype, rng));
    const double time = seconds(backend, repeats, [&](Stream& s) {
      ops::swiglu_forward(t[0], t[1], t[2], s);
      ops::swiglu_backward(t[0], t[1], t[3], t[4], t[5], s);
    });
    // forward + backward = 3 forwards in the model's count (step_time.h)
    r.elementwise_bytes_per_s =
        3 * kSwigluBytesPerElement * static_cast<double>(rows * F) * dtype_size(dtype) / time;
  }

  // The head's softmax cross-entropy, forward and backward, over at most 2^22 logits.
  {
    const int64_t V = m.vocab_size;
    const int64_t rows = std::clamp<int64_t>(N, 1, std::max<int64_t>(1, (int64_t{1} << 22) / V));
    OwnedTensor logits = seeded(backend, Shape{rows, V}, dtype, rng);
    OwnedTensor dlogits = seeded(backend, Shape{rows, V}, dtype, rng);
    OwnedTensor losses = seeded(backend, Shape{rows}, dtype, rng);
    OwnedTensor labels =
        OwnedTensor::device(backend, Shape{rows}, DType::i64, LiveSet::workspace, "rate labels");
    std::vector<double> host_labels(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      host_labels[static_cast<size_t>(i)] = static_cast<double>((i * 7919) % V);
    }
    copy_from_host_as(host_labels, labels, backend, backend.default_stream());
    const double time = seconds(backend, repeats, [&](Stream& s) {
      ops::cross_entropy_forward(logits, labels, losses, s);
      ops::cross_entropy_backward(logits, labels, 1.0 / static_cast<double>(rows), dlogits, s);
    });
    r.loss_bytes_per_s =
        kLossBytesPerLogit * static_cast<double>(rows * V) * dtype_size(dtype) / time;
  }

  // An op's fixed cost: an add of one element, its hand-off and completion.
  {
    OwnedTensor x = seeded(backend, Shape{1}, dtype, rng);
    r.op_latency_s = seconds(backend, std::max(repeats, 9),
                             [&](Stream& s) {
                               for (int i = 0; i < 16; ++i) ops::add(x, x, x, s);
                             }) /
                     16;
  }

  // The host: a 64 MiB memcpy (the CPU backend's host link and AdamW's memory rate).
  {
    const size_t bytes = size_t{64} << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    std::vector<double> times;
    for (int i = 0; i < repeats + 1; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) times.push_back(s);
    }
    const double rate = 2.0 * static_cast<double>(bytes) / median(times);  // read + write
    r.host_memory_bytes_per_s = rate;
    r.host_link_bytes_per_s = rate / 2;
  }
  r.peak_flops = measure_backend_gemm_gflops(backend, dtype, cuda ? 8192 : 1024, 3) * 1e9;
  return r;
}

}  // namespace moepeak::measure
