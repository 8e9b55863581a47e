// `moepeak bench attention`: causal grouped-query flash attention of one layer of a model,
// forward and backward, at a batch and sequence length of your choice, against the GEMM ceiling
// measured in the same run (one n^3 GEMM through the same backend, best of five). It says which
// kernels ran (the CPU's OpenBLAS blocks, CUDA's tensor-core kernels for bf16 with d = 32, 64,
// 128, or CUDA's SIMT kernels), so a long-context run's attention cost can be read before launch.
//
//   moepeak bench attention [--config F]... [--set k=v]... [--batch B] [--seq T]
//                           [--dtype f32|bf16] [--ceiling-size n] [--warmup 2] [--iters 5]
//                           [--json FILE]
//
// Shapes: nh, nkv and d are the config's model; B and T default to training.batch_size and
// training.seq_len. dtype defaults to bf16 on CUDA, f32 on the CPU. FLOPs count the causal half
// once, as FlashAttention's papers do: forward 4 B nh d T(T+1)/2 (Q K^T and P V), backward 2.5x
// that (the recomputed Q K^T is not counted). Inputs are seeded normals (q, k scaled by d^-1/4
// so the softmax is neither flat nor one-hot). One process.
//
// Test: ctest -R cli (the CPU, the tiny model: the table and the JSON); results in docs/perf.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/runtime/backend.h"
#include "ops/attention.h"

namespace moepeak::cli {
namespace {

struct AttentionArgs {
  BenchCommonArgs common;
  int64_t batch = 0;  // 0 = training.batch_size
  int64_t seq = 0;    // 0 = training.seq_len
  CeilingArgs ceiling;
};

int run_bench_attention(const AttentionArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  std::unique_ptr<Backend> backend = Backend::create(bench_any_backend_options(cfg, RankInfo{}));
  const Ceiling ceil =
      measure_ceiling(*backend, args.ceiling.dtype, args.ceiling.ceiling_size, "attention");
  const DType dtype = ceil.dtype;
  const int64_t B = args.batch > 0 ? args.batch : cfg.training.batch_size;
  const int64_t T = args.seq > 0 ? args.seq : cfg.training.seq_len;
  const ModelConfig& m = cfg.model;
  const int64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads, d = m.head_dim;

  const Shape q_shape{B, T, nh, d}, kv_shape{B, T, nkv, d};
  auto q = OwnedTensor::device(*backend, q_shape, dtype, LiveSet::attention, "bench q");
  auto k = OwnedTensor::device(*backend, kv_shape, dtype, LiveSet::attention, "bench k");
  auto v = OwnedTensor::device(*backend, kv_shape, dtype, LiveSet::attention, "bench v");
  auto dout = OwnedTensor::device(*backend, q_shape, dtype, LiveSet::attention, "bench dout");
  auto out = filled(*backend, q_shape, dtype, 0.0, "bench out");
  auto lse = OwnedTensor::device(*backend, Shape{B, nh, T}, ops::attention_lse_dtype(dtype),
                                 LiveSet::attention, "bench lse");
  auto dq = filled(*backend, q_shape, dtype, 0.0, "bench dq");
  auto dk = filled(*backend, kv_shape, dtype, 0.0, "bench dk");
  auto dv = filled(*backend, kv_shape, dtype, 0.0, "bench dv");
  std::mt19937_64 rng(20261130);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double qk_scale = std::pow(static_cast<double>(d), -0.25);
  fill_seeded(q, *backend, [&] { return qk_scale * normal(rng); });
  fill_seeded(k, *backend, [&] { return qk_scale * normal(rng); });
  fill_seeded(v, *backend, [&] { return normal(rng); });
  fill_seeded(dout, *backend, [&] { return normal(rng); });
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const char* kernels = ops::attention_kernels(q, k, v, out);

  const double ceiling = ceil.gflops;
  const double pairs = static_cast<double>(B) * static_cast<double>(nh) * static_cast<double>(T) *
                       static_cast<double>(T + 1) / 2.0;
  const double forward_flops = 4.0 * static_cast<double>(d) * pairs;
  std::printf("# moepeak bench attention: %s\n", backend->describe().c_str());
  std::printf("# host %s, %s; model %s: B %lld, T %lld, nh %lld, nkv %lld, d %lld, dtype %s\n",
              process_host().c_str(), now_utc().c_str(), cfg.job.name.c_str(),
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(nh),
              static_cast<long long>(nkv), static_cast<long long>(d), ceil.dtype_text.c_str());
  std::printf(
      "# kernels: %s; ceiling: %d^3 GEMM through ops::linear_forward, best of 5: %.1f "
      "GFLOP/s\n",
      kernels, ceil.n, ceiling);
  std::printf("# %-9s %11s %12s %11s %9s\n", "pass", "time_ms", "GFLOP", "GFLOP/s", "%ceiling");

  EventTimer timer(*backend);
  struct Pass {
    const char* name;
    double flops;
    std::function<void(Stream&)> run;
  };
  const Pass passes[] = {
      {"forward", forward_flops,
       [&](Stream& s) { ops::attention_forward(q, k, v, scale, out, lse, s); }},
      {"backward", 2.5 * forward_flops,
       [&](Stream& s) { ops::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, s); }},
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const Pass& p : passes) {
    const double t = timer.median_ms(args.common.warmup, args.common.iters, p.run);
    const double gflops = p.flops / (t * 1e-3) / 1e9;
    std::printf("  %-9s %11.4f %12.3f %11.1f %8.1f%%\n", p.name, t, p.flops / 1e9, gflops,
                100.0 * gflops / ceiling);
    rows.push_back({{"schedule", p.name},
                    {"time_s", t * 1e-3},
                    {"peak_bytes", peak_bytes_json(backend->arena().stats())},
                    {"bound_bytes", nullptr},
                    {"max_rel_err", nullptr},
                    {"gflop", p.flops / 1e9},
                    {"gflops", gflops},
                    {"percent_of_ceiling", 100.0 * gflops / ceiling}});
  }
  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"model", cfg.job.name},
                            {"batch", B},
                            {"seq", T},
                            {"heads", nh},
                            {"kv_heads", nkv},
                            {"head_dim", d},
                            {"dtype", ceil.dtype_text},
                            {"kernels", kernels},
                            {"backend", backend->describe()},
                            {"ceiling_size", ceil.n},
                            {"ceiling_gflops", ceiling}};
    write_bench_json(args.common.json_path, "attention", 1, shape, rows);
  }
  return 0;
}

}  // namespace

void register_bench_attention(CLI::App& bench, Context& ctx) {
  static AttentionArgs args;
  auto* sub = bench.add_subcommand(
      "attention",
      "a layer's causal GQA flash attention, forward and backward, against a GEMM "
      "ceiling");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--batch", args.batch, "sequences (default training.batch_size)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--seq", args.seq, "tokens per sequence (default training.seq_len)")
      ->check(CLI::PositiveNumber);
  add_ceiling_options(*sub, args.ceiling);
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_bench_attention(args, ctx); }; });
}

}  // namespace moepeak::cli
