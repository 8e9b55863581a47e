// `moepeak bench gemm`: the GEMMs of one training step of a model (q/k/v/o projections, the
// router gate, the experts' w1/w3/w2 at the mean rows per expert — one expert alone through
// ops::linear_*, and all E experts as the dispatchers run them, one grouped GEMM per projection
// through ops::grouped_linear_* — and an LM-head strip of V/8 columns), each forward and
// backward, against a GEMM ceiling measured in
// the same run: one large square GEMM (n^3, --ceiling-size) through the same backend, the best of
// five. On CUDA the ceiling is cuBLASLt at its best shape, so %ceiling says how much the model's
// shapes lose to their size (the GPU target: at least 85%). On CUDA each non-grouped row is
// also timed with cuBLASLt's next 7 heuristic algorithms (ops::set_gemm_algorithm_rank): %best is
// the fastest of the 8 over moepeak's own choice, the per-shape ceiling of that GEMM. A grouped
// row (one cublasGemmGroupedBatchedEx per product) is also timed as one cuBLASLt GEMM per group
// (ops::set_grouped_gemm_per_group) with each of the 8 algorithms: its %best is the fastest of
// those 9 over the grouped call's time.
//
//   moepeak bench gemm [--config F]... [--set k=v]... [--tokens N] [--dtype f32|bf16]
//                      [--ceiling-size n] [--warmup 2] [--iters 5] [--json FILE]
//
// The backend is runtime.backend (auto = CUDA when a GPU is usable); the model is the config's
// (default: the embedded one; `-c configs/small.toml` for the small preset); N defaults to the
// config's batch_size * seq_len. dtype defaults to bf16 on CUDA and f32 on the CPU. One process.
//
// Test: ctest -R bench_gemm (the CPU, a tiny model: the table and the JSON); results in
// docs/perf.md.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/metrics/flops.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/grouped_linear.h"
#include "ops/linear.h"

namespace moepeak::cli {
namespace {

struct GemmArgs {
  BenchCommonArgs common;
  int64_t tokens = 0;  // 0 = batch_size * seq_len
  CeilingArgs ceiling;
};

// y (M, N) = x (M, K) w (N, K)^T, one of a step's GEMMs; with groups > 1, `groups` such GEMMs
// with their own weights over consecutive row blocks, in one grouped call.
struct GemmShape {
  std::string name;
  int64_t m, n, k;
  int64_t groups = 1;
};

std::vector<GemmShape> step_gemms(const ModelConfig& model, int64_t tokens) {
  const int64_t H = model.hidden_size, d = model.head_dim, nh = model.num_attention_heads;
  const int64_t nkv = model.num_key_value_heads, E = model.num_local_experts;
  const int64_t k = model.num_experts_per_tok, F = model.expert_intermediate_size();
  const int64_t rows = std::max<int64_t>(1, tokens * k / E);  // mean rows per expert
  const int64_t strip = std::max<int64_t>(1, model.vocab_size / 8);
  return {{"q_proj", tokens, nh * d, H},      {"kv_proj", tokens, nkv * d, H},
          {"o_proj", tokens, H, nh * d},      {"router", tokens, E, H},
          {"expert_w1_w3", rows, F, H},       {"expert_w2", rows, H, F},
          {"experts_w1_w3", rows, F, H, E},   {"experts_w2", rows, H, F, E},
          {"lm_head_strip", tokens, strip, H}};
}

int run_bench_gemm(const GemmArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  std::unique_ptr<Backend> backend = Backend::create(bench_any_backend_options(cfg, RankInfo{}));
  const int64_t tokens =
      args.tokens > 0 ? args.tokens : cfg.training.batch_size * cfg.training.seq_len;

  const Ceiling ceil =
      measure_ceiling(*backend, args.ceiling.dtype, args.ceiling.ceiling_size, "gemm");
  const DType dtype = ceil.dtype;
  const std::string& dtype_text = ceil.dtype_text;
  const int ceiling_n = ceil.n;
  const double ceiling = ceil.gflops;
  std::printf("# moepeak bench gemm: %s\n", backend->describe().c_str());
  std::printf("# host %s, %s; model %s, %lld tokens, dtype %s\n", process_host().c_str(),
              now_utc().c_str(), cfg.job.name.c_str(), static_cast<long long>(tokens),
              dtype_text.c_str());
  std::printf("# ceiling: %d^3 GEMM through ops::linear_forward, best of 5: %.1f GFLOP/s\n",
              ceiling_n, ceiling);
  const bool search = backend->kind() == BackendKind::cuda;
  if (search) {
    std::printf(
        "# %%best: the fastest of cuBLASLt's first %d heuristic algorithms for the row's "
        "GEMMs over the time of the one moepeak runs (its first); grouped rows: the "
        "fastest of the grouped call and one GEMM per group at each of those algorithms\n",
        ops::kGemmAlgorithmRanks);
  }
  std::printf("# %-14s %7s %7s %7s %9s %11s %11s %9s %7s\n", "gemm", "M", "N", "K", "pass",
              "time_ms", "GFLOP/s", "%ceiling", "%best");

  nlohmann::json rows = nlohmann::json::array();
  EventTimer timer(*backend);
  for (const GemmShape& g : step_gemms(cfg.model, tokens)) {
    const int64_t G = g.groups, M = G * g.m;
    auto x = filled(*backend, Shape{M, g.k}, dtype, 0.01, "x");
    auto w = filled(*backend, Shape{G * g.n, g.k}, dtype, 0.01, "w");
    auto y = filled(*backend, Shape{M, g.n}, dtype, 0.0, "y");
    auto dx = filled(*backend, Shape{M, g.k}, dtype, 0.0, "dx");
    auto dw = filled(*backend, Shape{G * g.n, g.k}, dtype, 0.0, "dw");
    std::vector<Tensor> ws, dws;  // group e's (N, K) weight and gradient
    std::vector<int64_t> offsets = {0};
    for (int64_t e = 0; e < G; ++e) {
      ws.push_back(w.view().rows(e * g.n, (e + 1) * g.n));
      dws.push_back(dw.view().rows(e * g.n, (e + 1) * g.n));
      offsets.push_back((e + 1) * g.m);
    }
    struct Pass {
      const char* name;
      double flops;
      std::function<void(Stream&)> run;
    };
    const double mnk = 2.0 * static_cast<double>(M) * g.n * g.k;
    std::vector<Pass> passes;
    if (G == 1) {
      passes = {{"forward", mnk, [&](Stream& s) { ops::linear_forward(x, w, y, false, s); }},
                {"backward", 2 * mnk,
                 [&](Stream& s) { ops::linear_backward(x, w, y, dx, false, dw, s); }}};
    } else {
      passes = {{"forward", mnk,
                 [&](Stream& s) { ops::grouped_linear_forward(x, ws, offsets, y, false, s); }},
                {"backward", 2 * mnk, [&](Stream& s) {
                   ops::grouped_linear_backward(x, ws, offsets, y, dx, false, dws, s);
                 }}};
    }
    for (const Pass& p : passes) {
      const double t = timer.median_ms(args.common.warmup, args.common.iters, p.run);
      const double gflops = p.flops / (t * 1e-3) / 1e9;
      // The per-shape ceiling: the same op with each other algorithm the heuristic offers (and,
      // grouped, as one GEMM per group at each of them).
      nlohmann::json best = nullptr;
      std::string best_text = "-";
      if (search) {
        double best_ms = t;
        if (G > 1) ops::set_grouped_gemm_per_group(true);
        for (int rank = G > 1 ? 0 : 1; rank < ops::kGemmAlgorithmRanks; ++rank) {
          ops::set_gemm_algorithm_rank(rank);
          best_ms =
              std::min(best_ms, timer.median_ms(args.common.warmup, args.common.iters, p.run));
        }
        ops::set_gemm_algorithm_rank(0);
        ops::set_grouped_gemm_per_group(false);
        best = 100.0 * best_ms / t;
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * best_ms / t);
        best_text = buf;
      }
      std::printf("  %-14s %7lld %7lld %7lld %9s %11.4f %11.1f %8.1f%% %7s\n", g.name.c_str(),
                  static_cast<long long>(M), static_cast<long long>(g.n),
                  static_cast<long long>(g.k), p.name, t, gflops, 100.0 * gflops / ceiling,
                  best_text.c_str());
      rows.push_back({{"schedule", g.name + " " + p.name},
                      {"time_s", t * 1e-3},
                      {"peak_bytes", peak_bytes_json(backend->arena().stats())},
                      {"bound_bytes", nullptr},
                      {"max_rel_err", nullptr},
                      {"m", M},
                      {"n", g.n},
                      {"k", g.k},
                      {"groups", G},
                      {"gflops", gflops},
                      {"percent_of_ceiling", 100.0 * gflops / ceiling},
                      {"percent_of_best_algorithm", best}});
    }
  }
  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"model", cfg.job.name},     {"tokens", tokens},
                            {"dtype", dtype_text},       {"backend", backend->describe()},
                            {"ceiling_size", ceiling_n}, {"ceiling_gflops", ceiling}};
    write_bench_json(args.common.json_path, "gemm", 1, shape, rows);
  }
  return 0;
}

}  // namespace

void register_bench_gemm(CLI::App& bench, Context& ctx) {
  static GemmArgs args;
  auto* sub = bench.add_subcommand(
      "gemm",
      "a step's GEMMs (projections, router, experts, LM-head strip) against a GEMM ceiling");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--tokens", args.tokens, "tokens per step (default batch_size * seq_len)")
      ->check(CLI::PositiveNumber);
  add_ceiling_options(*sub, args.ceiling);
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_bench_gemm(args, ctx); }; });
}

}  // namespace moepeak::cli
