// The measurement harness (see harness.h).
#include "core/measure/harness.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/train/trainer.h"
#include "ops/fill.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak::measure {

BackendOptions bench_backend_options(const Config& cfg, const RankInfo& ranks) {
  BackendOptions o;
  o.kind = BackendKind::cpu;
  o.device_memory = cfg.runtime.device_memory_bytes().value_or(0);
  o.cpu_threads = static_cast<int>(cfg.runtime.threads);
  if (o.cpu_threads == 0 && ranks.local_size > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.cpu_threads = std::max(1, cores / ranks.local_size);
  }
  return o;
}

BackendOptions bench_any_backend_options(const Config& cfg, const RankInfo& ranks) {
  if (!uses_cuda_backend(cfg)) return bench_backend_options(cfg, ranks);
  BackendOptions o;
  o.kind = BackendKind::cuda;
  o.device_index = ranks.local_rank;
  o.device_memory = cfg.runtime.device_memory_bytes().value_or(0);
  o.numa_node = static_cast<int>(cfg.runtime.numa_node);
  return o;
}

Ceiling measure_ceiling(Backend& backend, const std::string& dtype, int size, const char* bench) {
  const bool cuda = backend.kind() == BackendKind::cuda;
  Ceiling c;
  c.dtype_text = !dtype.empty() ? dtype : cuda ? "bf16" : "f32";
  MOEPEAK_CHECK_INPUT(c.dtype_text == "f32" || c.dtype_text == "bf16", "bench ", bench, " --dtype ",
                      c.dtype_text, ": the GEMM ceiling is measured in f32 or bf16");
  c.dtype = c.dtype_text == "bf16" ? DType::bf16 : DType::f32;
  c.n = size > 0 ? size : cuda ? 8192 : 1024;
  c.gflops = measure_backend_gemm_gflops(backend, c.dtype, c.n, 5);
  return c;
}

void repeat_head(const Tensor& t, int64_t head, Backend& backend) {
  Stream& stream = backend.default_stream();
  const size_t elem = dtype_size(t.dtype());
  char* base = static_cast<char*>(t.data());
  for (int64_t done = head; head > 0 && done < t.numel();) {
    const int64_t n = std::min(done, t.numel() - done);  // [0, n) again at [done, done + n)
    backend.copy_async(base + done * elem, base, static_cast<size_t>(n) * elem,
                       CopyKind::device_to_device, stream);
    done += n;
  }
  stream.synchronize();
}

std::vector<double> read_sampled_rows(const Tensor& t, Backend& backend, Stream& stream) {
  if (t.numel() <= kHostElements || t.ndim() < 2) return copy_to_host_as_double(t, backend, stream);
  const int64_t rows = t.size(0), per_row = t.numel() / rows;
  const int64_t stride = (t.numel() + kHostElements - 1) / kHostElements;  // rows apart
  std::vector<double> out;
  out.reserve(static_cast<size_t>((rows + stride - 1) / stride * per_row));
  for (int64_t r = 0; r < rows; r += stride) {
    const std::vector<double> row = copy_to_host_as_double(t.rows(r, r + 1), backend, stream);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

DType bench_dtype(const std::string& text) {
  return text == "f64" ? DType::f64 : text == "bf16" ? DType::bf16 : DType::f32;
}

OwnedTensor filled(Backend& b, Shape shape, DType dtype, double value, const char* what) {
  auto t = OwnedTensor::device(b, shape, dtype, LiveSet::workspace, what);
  ops::fill(t, value, b.default_stream());
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void max_over_ranks(Comm& comm, Backend& backend, std::vector<double>& values) {
  if (comm.world_size() > 1 && !values.empty()) {
    all_reduce_host(comm, backend, backend.default_stream(), values, ReduceOp::max);
  }
}

double max_over_ranks(Comm& comm, Backend& backend, double value) {
  std::vector<double> values = {value};
  max_over_ranks(comm, backend, values);
  return values[0];
}

double max_scaled_err(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

std::vector<schedules::ExpertWeights> seeded_local_experts(Backend& backend, DType dtype,
                                                           int64_t experts, int rank, int world,
                                                           int64_t hidden, int64_t ffn,
                                                           std::vector<OwnedTensor>& storage) {
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                "bench experts: dtype ", dtype_name(dtype), " (f32, bf16 or f64 expected)");
  const int64_t H = hidden, F = ffn, per_rank = experts / world;
  std::vector<schedules::ExpertWeights> out;
  for (int64_t e = rank * per_rank; e < (rank + 1) * per_rank; ++e) {
    std::mt19937_64 rng(777 + static_cast<uint64_t>(e));
    std::uniform_real_distribution<double> uni(-1.0, 1.0);
    schedules::ExpertWeights ex;
    auto add = [&](Shape shape, LiveSet set, double scale, Tensor& slot) {
      const DType as = set == LiveSet::grads ? schedules::main_grad_dtype(dtype) : dtype;
      storage.push_back(OwnedTensor::device(backend, shape, as, set, "bench expert"));
      const OwnedTensor& t = storage.back();
      if (scale == 0) {
        ops::fill(t, 0.0, backend.default_stream());  // the gradients: nothing to draw
      } else {
        fill_seeded(t, backend, [&] { return scale * uni(rng); });
      }
      slot = t.view();
    };
    add(Shape{F, H}, LiveSet::weights, 1.0 / std::sqrt(double(H)), ex.w1);
    add(Shape{F, H}, LiveSet::weights, 1.0 / std::sqrt(double(H)), ex.w3);
    add(Shape{H, F}, LiveSet::weights, 1.0 / std::sqrt(double(F)), ex.w2);
    add(Shape{F, H}, LiveSet::grads, 0.0, ex.dw1);
    add(Shape{F, H}, LiveSet::grads, 0.0, ex.dw3);
    add(Shape{H, F}, LiveSet::grads, 0.0, ex.dw2);
    out.push_back(ex);
  }
  return out;
}

SeededRouting seeded_routing(const std::string& kind, int64_t tokens, int64_t experts,
                             int64_t top_k, double zipf_s, int64_t segments, std::mt19937_64& rng) {
  MOEPEAK_CHECK(kind == "balanced" || kind == "zipf" || kind == "segments" || kind == "adversarial",
                "bench routing: unknown kind '", kind, "' (balanced, zipf, segments, adversarial)");
  MOEPEAK_CHECK(top_k >= 1 && top_k <= experts && segments >= 1, "bench routing: top-", top_k,
                " of ", experts, " experts, ", segments, " segments");
  const int64_t N = tokens, E = experts, k = top_k;
  std::uniform_real_distribution<double> pos(0.1, 1.0), u01(1e-12, 1.0);
  std::vector<double> p(static_cast<size_t>(E), 1.0);
  if (kind == "zipf" || kind == "segments") {
    for (int64_t e = 0; e < E; ++e) p[e] = 1.0 / std::pow(double(e + 1), zipf_s);
  }
  SeededRouting r;
  r.index.resize(static_cast<size_t>(N * k));
  r.weight.resize(static_cast<size_t>(N * k));
  std::mt19937_64 segment_rng(99);  // the same segment rankings on every rank
  const int64_t segment = std::max<int64_t>(1, (N + segments - 1) / segments);
  const std::vector<double> base = p;
  std::vector<std::pair<double, int64_t>> keys;
  for (int64_t n = 0; n < N; ++n) {
    if (kind == "segments" && n % segment == 0) {  // a new ranking of the experts
      std::vector<int64_t> rank(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) rank[e] = e;
      std::shuffle(rank.begin(), rank.end(), segment_rng);
      for (int64_t e = 0; e < E; ++e) p[rank[e]] = base[e];
    }
    keys.clear();
    if (kind == "adversarial") {
      for (int64_t e = 0; e < k; ++e) keys.push_back({u01(rng), e});
    } else {
      for (int64_t e = 0; e < E; ++e) keys.push_back({std::pow(u01(rng), 1.0 / p[e]), e});
    }
    std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), std::greater<>());
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (r.weight[n * k + j] = pos(rng));
    for (int64_t j = 0; j < k; ++j) {
      r.index[n * k + j] = static_cast<int32_t>(keys[j].second);
      r.weight[n * k + j] /= sum;
    }
  }
  return r;
}

}  // namespace moepeak::measure
