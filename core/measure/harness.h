// The measurement harness every bench and tune sweep shares: the backend a measuring rank runs
// on, seeded inputs (tensors, routing, experts), timers, the median, and maxima over ranks.
//
//   auto backend = Backend::create(bench_any_backend_options(cfg, ranks));
//   fill_seeded(x, *backend, [&] { return uni(rng); });          // inputs in element order
//   SeededRouting r = seeded_routing("zipf", N, E, k, 1.2, 1, rng);
//   double t = max_over_ranks(*comm, *backend, median(times));  // the slowest rank's
//
// Everything is seeded, so runs of different schedules (and of different rank counts, for the
// experts) see the same values. Test: ctest -R test_measure
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"

namespace moepeak::measure {

// The CPU backend a bench rank runs on: runtime.device_memory as configured, runtime.threads or,
// for 0, this rank's share of the host's cores (the ranks of one host share them).
BackendOptions bench_backend_options(const Config& cfg, const RankInfo& ranks);
// The backend of a bench or tune rank: CUDA on the rank's local GPU when runtime.backend is
// "cuda", or "auto" with a usable GPU (device memory as configured, else the card's free memory
// less the reserve; the pinned pool on runtime.numa_node); otherwise bench_backend_options.
BackendOptions bench_any_backend_options(const Config& cfg, const RankInfo& ranks);

// NOTES: at GPU shapes a bench's tensors hold billions of elements (an LM head of 200,000 x
// 7168, 32 experts of 3 x 2880 x 2880); drawing each on the host, or reading each result back
// as a double, took minutes and tens of GB. The host touches at most this many elements of one
// tensor: inputs repeat their first kHostElements values, results are compared on sampled rows.
// Every CI-sized tensor is below it, so those are drawn and compared whole.
constexpr int64_t kHostElements = int64_t{1} << 24;

// Copies the first `head` elements of `t` over the rest, in place and periodically (doubling
// copies on the default stream), and waits for it. Tensors are contiguous.
void repeat_head(const Tensor& t, int64_t head, Backend& backend);

// Writes next() into each element of `t` in order (any dtype, rounded to it; device or host
// memory of either backend) and waits for the default stream: the seeded inputs of a bench.
// Past kHostElements the values repeat: element i is the (i mod kHostElements)-th drawn, copied
// on the device.
template <typename Next>
void fill_seeded(const Tensor& t, Backend& backend, Next&& next) {
  const int64_t drawn = std::min(t.numel(), kHostElements);
  std::vector<double> values(static_cast<size_t>(drawn));
  for (double& v : values) v = static_cast<double>(next());
  const Tensor head = t.reshape(Shape{t.numel()}).rows(0, drawn);
  copy_from_host_as(values, head, backend, backend.default_stream());
  repeat_head(t, drawn, backend);
}

// The rows of `t` (dim 0) a bench reads back to compare: every row while t has at most
// kHostElements elements, else every s-th, s the least stride that keeps to it. The same
// stride for tensors of the same shape, so two results compare row for row.
std::vector<double> read_sampled_rows(const Tensor& t, Backend& backend, Stream& stream);

// A bench's --dtype text: "f64", "bf16", anything else f32 (the flags check the names).
DType bench_dtype(const std::string& text);

// A device tensor of the workspace live set with every element `value`.
OwnedTensor filled(Backend& b, Shape shape, DType dtype, double value, const char* what);

// The median (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> v);

// Each element replaced by its maximum over the ranks of `comm` (no-op on one rank): a time
// becomes the slowest rank's, a peak the largest. Byte counts are far below 2^53, so exact.
void max_over_ranks(Comm& comm, Backend& backend, std::vector<double>& values);
double max_over_ranks(Comm& comm, Backend& backend, double value);

// max |got - want| / max |want| over the elements (the absolute error when want is all zero);
// infinite on a NaN in either.
double max_scaled_err(const std::vector<double>& got, const std::vector<double>& want);

// Times work on the backend's default stream with a pair of events (bench gemm, bench attention).
class EventTimer {
 public:
  explicit EventTimer(Backend& b)
      : backend_(b),
        start_(b.create_event(EventTiming::on)),
        end_(b.create_event(EventTiming::on)) {}
  // Milliseconds of `work(stream)` on the default stream.
  template <typename F>
  double time_ms(F&& work) {
    Stream& s = backend_.default_stream();
    start_->record(s);
    work(s);
    end_->record(s);
    end_->synchronize();
    return end_->elapsed_ms(*start_);
  }
  // The median of `iters` timings of `work` after `warmup` untimed ones, in milliseconds.
  template <typename F>
  double median_ms(int warmup, int iters, F&& work) {
    std::vector<double> ms;
    for (int i = 0; i < warmup + iters; ++i) {
      const double t = time_ms(work);
      if (i >= warmup) ms.push_back(t);
    }
    return median(ms);
  }

 private:
  Backend& backend_;
  std::unique_ptr<Event> start_, end_;
};

// The GEMM ceiling the benches of one op are measured against (gemm, attention).
struct Ceiling {
  DType dtype = DType::f32;
  std::string dtype_text;  // "f32" | "bf16"
  int n = 0;               // the n^3 GEMM
  double gflops = 0;       // its best of five through ops::linear_forward
};
// dtype "" = bf16 on CUDA, f32 on the CPU (either may run f32 or bf16; another is an error naming
// `bench`); size 0 = 8192 on CUDA, 1024 on the CPU. Measures the ceiling on the backend.
Ceiling measure_ceiling(Backend& backend, const std::string& dtype, int size, const char* bench);

// This rank's E/W experts of a bench MoE layer (bench dispatch, tune): w1, w3 (F, H) and w2
// (H, F) uniform in +-1/sqrt(fan-in), gradients zero, the same values whichever rank owns an
// expert (each seeded by its id), so runs on any W compute the same layer. f32, bf16 or f64
// weights, gradients in schedules::main_grad_dtype (fp32 beside bf16, as the model's); the
// tensors are appended to `storage`, which must outlive the returned views.
std::vector<schedules::ExpertWeights> seeded_local_experts(Backend& backend, DType dtype,
                                                           int64_t experts, int rank, int world,
                                                           int64_t hidden, int64_t ffn,
                                                           std::vector<OwnedTensor>& storage);

// Top-k routing of a bench MoE layer (bench dispatch, tune): k distinct experts per token, drawn
// by exponential keys (u^(1/p_e), the k largest), with positive weights renormalised to sum 1.
//   balanced     p_e = 1
//   zipf         p_e ~ 1 / (e + 1)^zipf_s (the hot experts are rank 0's)
//   segments     zipf over a ranking of the experts that changes every ceil(N / segments)
//                tokens (the rankings are the same on every rank)
//   adversarial  every token picks experts 0..k-1
// Draws from `rng` in token order: E keys (k for adversarial), then k weights, per token.
struct SeededRouting {
  std::vector<int32_t> index;  // (N, k)
  std::vector<double> weight;  // (N, k)
};
SeededRouting seeded_routing(const std::string& kind, int64_t tokens, int64_t experts,
                             int64_t top_k, double zipf_s, int64_t segments, std::mt19937_64& rng);

}  // namespace moepeak::measure
