// Shared by the `moepeak bench <name>` subcommands (one file each, cli/bench_*.cpp), nccl-tests
// style: every bench takes the same core flags, prints a `#`-commented header (what, host, date,
// world size) and a fixed-column table on stdout from rank 0, and with --json FILE writes the
// object of docs/design.md#machine-readable-outputs:
//   {"bench", "world_size", "shape": {...}, "rows": [{"schedule", "time_s", "peak_bytes":
//    {"total", <live set>...}, "bound_bytes", "max_rel_err", ...}], "host", "date"}
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/runtime/backend.h"
#include "core/runtime/memory_stats.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"

namespace moepeak::cli {

// The flags every bench has: --config/--set, --warmup, --iters, --json.
struct BenchCommonArgs {
  ConfigArgs config;
  int warmup = 2;
  int iters = 5;
  std::string json_path;
};
void add_bench_common_options(CLI::App& sub, BenchCommonArgs& args);

// The CPU backend a bench rank runs on: runtime.device_memory as configured, runtime.threads or,
// for 0, this rank's share of the host's cores (the ranks of one host share them).
BackendOptions bench_backend_options(const Config& cfg, const RankInfo& ranks);
// The backend of a bench or tune rank: CUDA on the rank's local GPU when runtime.backend is
// "cuda", or "auto" with a usable GPU (device memory as configured, else the card's free memory
// less the reserve; the pinned pool on runtime.numa_node); otherwise bench_backend_options.
BackendOptions bench_any_backend_options(const Config& cfg, const RankInfo& ranks);

// Writes next() into each element of `t` in order (any dtype, rounded to it; device or host
// memory of either backend) and waits for the default stream: the seeded inputs of a bench.
template <typename Next>
void fill_seeded(const Tensor& t, Backend& backend, Next&& next) {
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (double& v : values) v = static_cast<double>(next());
  copy_from_host_as(values, t, backend, backend.default_stream());
}

double median(std::vector<double> v);

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

// --dtype and --ceiling-size of the benches measured against a GEMM ceiling (gemm, attention).
struct CeilingArgs {
  std::string dtype;     // "" = bf16 on CUDA, f32 on the CPU
  int ceiling_size = 0;  // 0 = 8192 on CUDA, 1024 on the CPU
};
void add_ceiling_options(CLI::App& sub, CeilingArgs& args);
struct Ceiling {
  DType dtype = DType::f32;
  std::string dtype_text;  // "f32" | "bf16"
  int n = 0;               // the n^3 GEMM
  double gflops = 0;       // its best of five through ops::linear_forward
};
// Resolves the bench's dtype (bf16 on the CPU is an error naming `bench`) and measures the
// ceiling on the backend.
Ceiling measure_ceiling(Backend& backend, const CeilingArgs& args, const char* bench);

// A device tensor of the workspace live set with every element `value`.
OwnedTensor filled(Backend& b, Shape shape, DType dtype, double value, const char* what);

// This rank's E/W experts of a bench MoE layer (bench dispatch, tune): w1, w3 (F, H) and w2
// (H, F) uniform in +-1/sqrt(fan-in), gradients zero, the same values whichever rank owns an
// expert (each seeded by its id), so runs on any W compute the same layer. f32 or f64 (and bf16
// on CUDA); the tensors are appended to `storage`, which must outlive the returned views.
std::vector<schedules::ExpertWeights> seeded_local_experts(Backend& backend, DType dtype,
                                                           int64_t experts, int rank, int world,
                                                           int64_t hidden, int64_t ffn,
                                                           std::vector<OwnedTensor>& storage);
std::string now_utc();  // "2026-11-29 21:38:19 UTC"

// {"total": peak_total, "<live set>": that set's own peak, ...}
nlohmann::json peak_bytes_json(const MemoryStats& stats);

// Writes the §10 object (adding "host" and "date"); throws moepeak::Error naming the path.
void write_bench_json(const std::string& path, const std::string& bench, int world_size,
                      const nlohmann::json& shape, const nlohmann::json& rows);

// Bench subcommands registered on `moepeak bench` (each in its own cli/bench_<name>.cpp).
void register_bench_step(CLI::App& bench, Context& ctx);
void register_bench_sco(CLI::App& bench, Context& ctx);        // cli/bench_sco.cpp
void register_bench_vocab(CLI::App& bench, Context& ctx);      // cli/bench_vocab.cpp
void register_bench_adamw(CLI::App& bench, Context& ctx);      // cli/bench_adamw.cpp
void register_bench_dispatch(CLI::App& bench, Context& ctx);   // cli/bench_dispatch.cpp
void register_bench_gemm(CLI::App& bench, Context& ctx);       // cli/bench_gemm.cpp
void register_bench_attention(CLI::App& bench, Context& ctx);  // cli/bench_attention.cpp

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

}  // namespace moepeak::cli
