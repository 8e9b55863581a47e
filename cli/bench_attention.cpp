// `moepeak bench attention`: causal grouped-query flash attention of one layer of a model,
// forward and backward, at a batch and sequence length of your choice, against the GEMM ceiling
// measured in the same run (one n^3 GEMM through the same backend, best of five). It says which
// kernels ran (the CPU's OpenBLAS blocks, CUDA's tensor-core kernels for bf16 with d = 32, 64,
// 128, or CUDA's SIMT kernels), so a long-context run's attention cost can be read before launch.
// With --window W, --sinks and/or --documents L it times that variant (ops::AttentionVariant: a
// sliding window of W keys, gpt-oss's per-head sink logits, packed documents of mean length L)
// beside full causal attention at the same shape.
//
//   moepeak bench attention [--config F]... [--set k=v]... [--batch B] [--seq T]
//                           [--dtype f32|bf16] [--window W] [--sinks] [--documents L]
//                           [--v-head-dim DV] [--ceiling-size n] [--warmup 2] [--iters 5]
//                           [--json FILE]
//
// Shapes: nh, nkv and d (the query/key head dim dqk) are the config's model; --v-head-dim gives
// v and out a head dim dv of their own (DeepSeek-V3's multi-head latent attention: dqk 192,
// dv 128), default d. B and T default to training.batch_size and training.seq_len. dtype defaults
// to bf16 on CUDA, f32 on the CPU. FLOPs count each query's visible keys once, as
// FlashAttention's papers count the causal half: forward 2 (dqk + dv) B nh sum_t min(t + 1, W)
// (Q K^T and P V; sum_t (t + 1) = T(T+1)/2 without a window, W = 0), backward
// 2 (3 dqk + 2 dv) per visible pair (Q K^T recomputed, dQ and dK over dqk; dP and dV over dv),
// 2.5x the forward when dv = dqk; masked entries of the key blocks a kernel visits and the sinks
// (O(B nh T)) are not counted. With documents a query's visible keys are those of its document
// (and window): the FLOPs count sum_t min(t - doc_start[t] + 1, W). Inputs are seeded normals (q,
// k scaled by dqk^-1/4 so the softmax is neither flat nor one-hot; sinks N(0, 1)). Documents: each
// sequence is cut into documents of lengths drawn uniformly from [L - L/2, L + L/2] by a fixed
// seed (mean L), the last one cut at T; the same lengths every run. One process.
//
// Without a variant flag the table has the rows forward and backward; with any, four rows
// (variant causal, then the variant: forward, backward) and a `#` line with the variant's
// forward + backward time and FLOPs as a share of causal's. The JSON rows carry "variant"
// ("causal", or e.g. "window 128 + sinks", "documents 1024") beside "schedule" (the pass).
//
// Test: ctest -R cli (the CPU, the tiny model: the table and the JSON); results in docs/perf.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
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
  int64_t batch = 0;   // 0 = training.batch_size
  int64_t seq = 0;     // 0 = training.seq_len
  int64_t window = 0;  // 0 = no window (full causal)
  bool sinks = false;
  int64_t documents = 0;   // mean document length L; 0 = one document per sequence
  int64_t v_head_dim = 0;  // dv; 0 = the model's head_dim
  CeilingArgs ceiling;
};

// (query, key) pairs a variant computes, summed over the batch and query heads: each query t
// sees min(t + 1, W) keys (t + 1 with W = 0).
double visible_pairs(int64_t batch, int64_t heads, int64_t seq, int64_t window) {
  const double T = static_cast<double>(seq);
  double per_head = T * (T + 1) / 2;
  if (window > 0 && window < seq) {
    const double W = static_cast<double>(window);
    per_head = W * (W + 1) / 2 + (T - W) * W;  // t < W: t + 1 keys; t >= W: W keys
  }
  return static_cast<double>(batch) * static_cast<double>(heads) * per_head;
}

// (query, key) pairs with documents: query t of sequence b sees min(t - doc_start[b][t] + 1, W)
// keys (no bound with W = 0), summed over the batch and query heads.
double visible_pairs(int64_t heads, int64_t seq, int64_t window,
                     const std::vector<int32_t>& doc_start) {
  double pairs = 0;
  for (size_t i = 0; i < doc_start.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) % seq;
    const int64_t keys = t - doc_start[i] + 1;
    pairs += static_cast<double>(window > 0 ? std::min(keys, window) : keys);
  }
  return static_cast<double>(heads) * pairs;
}

// doc_start (B, T) of documents of lengths uniform in [L - L/2, L + L/2] (at least 1), drawn in
// order from a fixed seed; each sequence's last document is cut at T.
std::vector<int32_t> document_starts(int64_t batch, int64_t seq, int64_t mean_length) {
  std::mt19937_64 rng(20261208);
  std::uniform_int_distribution<int64_t> length(std::max<int64_t>(1, mean_length - mean_length / 2),
                                                mean_length + mean_length / 2);
  std::vector<int32_t> starts;
  starts.reserve(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t first = 0; first < seq;) {
      const int64_t end = std::min(seq, first + length(rng));
      starts.insert(starts.end(), static_cast<size_t>(end - first), static_cast<int32_t>(first));
      first = end;
    }
  return starts;
}

std::string variant_name(int64_t window, bool sinks, int64_t documents) {
  std::vector<std::string> parts;
  if (documents > 0) parts.push_back("documents " + std::to_string(documents));
  if (window > 0) parts.push_back("window " + std::to_string(window));
  if (sinks) parts.push_back("sinks");
  if (parts.empty()) return "causal";
  std::string name = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) name += " + " + parts[i];
  return name;
}

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
  const int64_t d_v = args.v_head_dim > 0 ? args.v_head_dim : d;

  const Shape q_shape{B, T, nh, d}, k_shape{B, T, nkv, d};
  const Shape v_shape{B, T, nkv, d_v}, out_shape{B, T, nh, d_v};
  auto q = OwnedTensor::device(*backend, q_shape, dtype, LiveSet::attention, "bench q");
  auto k = OwnedTensor::device(*backend, k_shape, dtype, LiveSet::attention, "bench k");
  auto v = OwnedTensor::device(*backend, v_shape, dtype, LiveSet::attention, "bench v");
  auto dout = OwnedTensor::device(*backend, out_shape, dtype, LiveSet::attention, "bench dout");
  auto out = filled(*backend, out_shape, dtype, 0.0, "bench out");
  auto lse = OwnedTensor::device(*backend, Shape{B, nh, T}, ops::attention_lse_dtype(dtype),
                                 LiveSet::attention, "bench lse");
  auto dq = filled(*backend, q_shape, dtype, 0.0, "bench dq");
  auto dk = filled(*backend, k_shape, dtype, 0.0, "bench dk");
  auto dv = filled(*backend, v_shape, dtype, 0.0, "bench dv");
  std::mt19937_64 rng(20261130);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double qk_scale = std::pow(static_cast<double>(d), -0.25);
  fill_seeded(q, *backend, [&] { return qk_scale * normal(rng); });
  fill_seeded(k, *backend, [&] { return qk_scale * normal(rng); });
  fill_seeded(v, *backend, [&] { return normal(rng); });
  fill_seeded(dout, *backend, [&] { return normal(rng); });
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const char* kernels = ops::attention_kernels(q, k, v, out);

  // The variant's sinks (q's dtype) and their gradient (lse's dtype), accumulated every run, and
  // its documents' doc_start (B, T) i32.
  const bool compare = args.window > 0 || args.sinks || args.documents > 0;
  OwnedTensor sinks, dsinks, doc_start;
  ops::AttentionVariant variant{args.window, Tensor()};
  if (args.sinks) {
    sinks = OwnedTensor::device(*backend, Shape{nh}, dtype, LiveSet::attention, "bench sinks");
    fill_seeded(sinks, *backend, [&] { return normal(rng); });
    dsinks = filled(*backend, Shape{nh}, ops::attention_lse_dtype(dtype), 0.0, "bench dsinks");
    variant.sinks = sinks;
  }
  std::vector<int32_t> starts;
  if (args.documents > 0) {
    MOEPEAK_CHECK(T <= INT32_MAX, "bench attention --documents: T = ", T,
                  " does not fit doc_start's i32");
    starts = document_starts(B, T, args.documents);
    doc_start = OwnedTensor::device(*backend, Shape{B, T}, DType::i32, LiveSet::attention,
                                    "bench doc_start");
    size_t next = 0;
    fill_seeded(doc_start, *backend, [&] { return static_cast<double>(starts[next++]); });
    variant.doc_start = doc_start;
  }

  const double ceiling = ceil.gflops;
  std::printf("# moepeak bench attention: %s\n", backend->describe().c_str());
  const std::string dims = d_v == d ? "d " + std::to_string(d)
                                    : "dqk " + std::to_string(d) + ", dv " + std::to_string(d_v);
  std::printf("# host %s, %s; model %s: B %lld, T %lld, nh %lld, nkv %lld, %s, dtype %s\n",
              process_host().c_str(), now_utc().c_str(), cfg.job.name.c_str(),
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(nh),
              static_cast<long long>(nkv), dims.c_str(), ceil.dtype_text.c_str());
  std::printf(
      "# kernels: %s; ceiling: %d^3 GEMM through ops::linear_forward, best of 5: %.1f "
      "GFLOP/s\n",
      kernels, ceil.n, ceiling);
  if (args.documents > 0) {
    int64_t count = 0;
    for (size_t i = 0; i < starts.size(); ++i)
      count += static_cast<int64_t>(i) % T == starts[i];  // a document's first position
    std::printf(
        "# documents: %lld in %lld sequences, lengths uniform in [%lld, %lld], the last of "
        "each cut at T\n",
        static_cast<long long>(count), static_cast<long long>(B),
        static_cast<long long>(std::max<int64_t>(1, args.documents - args.documents / 2)),
        static_cast<long long>(args.documents + args.documents / 2));
  }
  if (compare) {
    std::printf("# %-19s %-9s %11s %12s %11s %9s\n", "variant", "pass", "time_ms", "GFLOP",
                "GFLOP/s", "%ceiling");
  } else {
    std::printf("# %-9s %11s %12s %11s %9s\n", "pass", "time_ms", "GFLOP", "GFLOP/s", "%ceiling");
  }

  EventTimer timer(*backend);
  struct Pass {
    std::string variant;
    const char* name;
    double flops;
    std::function<void(Stream&)> run;
  };
  // FLOPs per visible (query, key) pair: forward Q K^T and P V, backward Q K^T (recomputed), dQ,
  // dK and dP, dV (see the file comment).
  const double forward_per_pair = 2.0 * static_cast<double>(d + d_v);
  const double backward_per_pair = 2.0 * static_cast<double>(3 * d + 2 * d_v);
  const double causal_pairs = visible_pairs(B, nh, T, 0);
  std::vector<Pass> passes = {
      {"causal", "forward", forward_per_pair * causal_pairs,
       [&](Stream& s) { ops::attention_forward(q, k, v, scale, out, lse, s); }},
      {"causal", "backward", backward_per_pair * causal_pairs,
       [&](Stream& s) { ops::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, s); }},
  };
  if (compare) {
    const std::string name = variant_name(args.window, args.sinks, args.documents);
    const double pairs = args.documents > 0 ? visible_pairs(nh, T, args.window, starts)
                                            : visible_pairs(B, nh, T, args.window);
    passes.push_back({name, "forward", forward_per_pair * pairs, [&](Stream& s) {
                        ops::attention_forward(q, k, v, scale, variant, out, lse, s);
                      }});
    passes.push_back({name, "backward", backward_per_pair * pairs, [&](Stream& s) {
                        ops::attention_backward(q, k, v, out, lse, dout, scale, variant, dq, dk, dv,
                                                dsinks, s);
                      }});
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> times;
  for (const Pass& p : passes) {
    // The backward reads out and lse: those of its own variant's forward, run just before.
    const double t = timer.median_ms(args.common.warmup, args.common.iters, p.run);
    times.push_back(t);
    const double gflops = p.flops / (t * 1e-3) / 1e9;
    if (compare) {
      std::printf("  %-19s %-9s %11.4f %12.3f %11.1f %8.1f%%\n", p.variant.c_str(), p.name, t,
                  p.flops / 1e9, gflops, 100.0 * gflops / ceiling);
    } else {
      std::printf("  %-9s %11.4f %12.3f %11.1f %8.1f%%\n", p.name, t, p.flops / 1e9, gflops,
                  100.0 * gflops / ceiling);
    }
    rows.push_back({{"schedule", p.name},
                    {"variant", p.variant},
                    {"time_s", t * 1e-3},
                    {"peak_bytes", peak_bytes_json(backend->arena().stats())},
                    {"bound_bytes", nullptr},
                    {"max_rel_err", nullptr},
                    {"gflop", p.flops / 1e9},
                    {"gflops", gflops},
                    {"percent_of_ceiling", 100.0 * gflops / ceiling}});
  }
  if (compare) {
    std::printf("# %s: forward + backward %.1f%% of causal's time, %.1f%% of its FLOPs\n",
                passes[2].variant.c_str(), 100.0 * (times[2] + times[3]) / (times[0] + times[1]),
                100.0 * passes[2].flops / passes[0].flops);
  }
  if (!args.common.json_path.empty()) {
    nlohmann::json shape = {{"model", cfg.job.name},
                            {"batch", B},
                            {"seq", T},
                            {"heads", nh},
                            {"kv_heads", nkv},
                            {"head_dim", d},
                            {"v_head_dim", d_v},
                            {"dtype", ceil.dtype_text},
                            {"kernels", kernels},
                            {"window", args.window},
                            {"sinks", args.sinks},
                            {"documents", args.documents},
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
      "ceiling (with --window/--sinks/--documents: that variant beside full causal)");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--batch", args.batch, "sequences (default training.batch_size)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--seq", args.seq, "tokens per sequence (default training.seq_len)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--window", args.window,
                  "also time a sliding window of W keys (query t sees t - W < s <= t) beside "
                  "full causal")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--sinks", args.sinks,
                "also time attention sinks (a logit per query head) beside full causal");
  sub->add_option("--documents", args.documents,
                  "also time packed documents of mean length L (lengths drawn from [L - L/2, "
                  "L + L/2], the last cut at T; a query sees only its document's keys) beside "
                  "full causal")
      ->check(CLI::PositiveNumber);
  sub->add_option("--v-head-dim", args.v_head_dim,
                  "value head dim dv of v and out (default the model's head_dim, which q and k "
                  "keep; DeepSeek-V3's MLA: head_dim 192, dv 128)")
      ->check(CLI::PositiveNumber);
  add_ceiling_options(*sub, args.ceiling);
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_bench_attention(args, ctx); }; });
}

}  // namespace moepeak::cli
