// `moepeak bench dispatch`: the paper's matched component test of expert dispatch — one MoE
// layer's dispatch, experts and combine, forward and backward, on W ranks — for the standard
// expert-parallel dispatcher, LLEP, and PipelinedLLEP with strided and contiguous chunks, on the
// same per-rank tokens, routing and experts. Each row: the median time of forward + backward,
// the measured peak of every live set (the `dispatch` set is the one the schedules differ in),
// the formula's bound for that set, and the largest relative error against the standard row
// over out, dx, dweight and this rank's expert weight gradients.
//
//   mpirun -np W moepeak bench dispatch [--tokens N] [--hidden H] [--ffn F] [--experts E]
//       [--top-k k] [--chunk-tokens c] [--max-chunks K]
//       [--routing balanced|zipf|segments|adversarial] [--segments 8]
//       [--zipf-s 1.2] [--lambda 1.3] [--alpha 1] [--min-tokens 32] [--slots S]
//       [--dtype f32|f64|bf16] [--recompute] [--warmup 2] [--iters 5] [--json FILE]
//
// N is tokens per rank; c defaults to ceil(N / 10) (K = 10, the paper's setting). Routing:
// balanced draws k distinct experts uniformly; zipf with p(e) ~ 1 / (e + 1)^s (the hot experts
// are rank 0's); segments is zipf over a ranking of the experts that changes every N / S
// positions (S = --segments), as when neighbouring tokens of a text favour the same experts —
// contiguous chunks then meet one segment's hot experts each, strided chunks all segments;
// adversarial sends every token to experts 0..k-1. --recompute times what a
// layer under gradient checkpointing runs: forward, the recompute's forward (its output dropped;
// PipelinedLLEP only plans there, as its backward recomputes the experts), backward — without
// it, forward + backward. Rank 0 prints and writes the
// JSON; times, peaks and errors are the maximum over ranks. Bounds: standard —
// dispatch_expert_parallel_bytes at its worst case R = W N k; llep — llep_dispatch_bytes;
// pipelined_llep — pipelined_llep_dispatch_bytes (its formula, which the peak equals); the header
// also prints PipelinedLLEP's slots S and tile rows T and pipelined_llep_bound_bytes (the paper's
// 2 Ep k c_eff H b plus the per-chunk metadata), the JSON's shape carries them. --config/--set
// only feed the runtime section (backend, device_memory, threads, and the CPU link model
// runtime.cpu_link_gb_per_s / cpu_link_latency_us, so that the dispatch lanes' overlap shows on
// a CPU): runtime.backend = "cuda" runs every rank on its local GPU with NCCL (one GPU per
// rank), and allows --dtype bf16.
//
// Test: ctest -R llep_bench_dispatch (2 ranks, a small shape: the JSON's rows, bounds and errors);
// results in docs/perf.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/measure/dispatch_layer.h"
#include "core/runtime/backend.h"
#include "core/train/trainer.h"
#include "core/units.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"

namespace moepeak::cli {
namespace {

struct DispatchBenchArgs {
  BenchCommonArgs common;
  int64_t tokens = 2048;
  int64_t hidden = 256;
  int64_t ffn = 512;
  int64_t experts = 32;
  int64_t top_k = 8;
  int64_t chunk_tokens = 0;  // 0: ceil(N / 10)
  int64_t max_chunks = 16;
  std::string routing = "zipf";
  double zipf_s = 1.2;
  int64_t segments = 8;
  double lambda = 1.3;
  double alpha = 1.0;
  int64_t min_tokens = 32;
  int64_t slots = 0;  // PipelinedLLEP's S; 0 = the rule
  std::string dtype = "f32";
  bool recompute = false;
};

// One schedule's row as this rank measured it.
struct Measured {
  std::string schedule, membership;
  double time_s = 0;
  MemoryStats stats;
  uint64_t bound = 0;
  measure::DispatchRun run;  // out, dx, dweight, dw against the standard row
  std::string note;
};

// The four schedules on one seeded layer (measure::DispatchLayer).
class DispatchBench {
 public:
  DispatchBench(const DispatchBenchArgs& args, const Config& cfg, const RankInfo& ranks)
      : args_(args),
        dtype_(bench_dtype(args.dtype)),
        backend_(Backend::create(bench_any_backend_options(cfg, ranks))),
        comm_(make_comm(*backend_, ranks, link_model(cfg.runtime))),
        layer_(*backend_, *comm_,
               {args.tokens, args.hidden, args.ffn, args.experts, args.top_k, dtype_, args.routing,
                args.zipf_s, args.segments}) {}

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }
  DType dtype() const { return dtype_; }
  std::string describe() const { return backend_->describe(); }

  schedules::PipelinedLlepParams pipeline_params(ChunkMembership membership) const {
    schedules::PipelinedLlepParams q;
    q.chunk_tokens = chunk_tokens();
    q.max_chunks = args_.max_chunks;
    q.membership = membership;
    q.lambda = args_.lambda;
    q.alpha = args_.alpha;
    q.min_tokens_per_gemm = args_.min_tokens;
    q.slots = args_.slots;
    return q;
  }
  int64_t chunk_tokens() const {
    return args_.chunk_tokens > 0 ? args_.chunk_tokens : (args_.tokens + 9) / 10;
  }

  Measured run_standard() {
    schedules::ExpertParallelDispatch d(*backend_, stream(), *comm_, dtype_, args_.experts);
    Measured m = measure("standard", d, measure::Recompute::output);
    m.bound = schedules::dispatch_expert_parallel_bytes(args_.tokens, args_.top_k, args_.hidden,
                                                        args_.ffn, dtype_,
                                                        world() * args_.tokens * args_.top_k);
    return m;
  }
  Measured run_llep() {
    const schedules::LlepParams q{args_.alpha, args_.lambda, args_.min_tokens};
    schedules::LlepDispatch d(*backend_, stream(), *comm_, dtype_, args_.experts, q);
    Measured m = measure("llep", d, measure::Recompute::output);
    m.bound = schedules::llep_dispatch_bytes(args_.tokens, args_.top_k, args_.hidden, args_.ffn,
                                             dtype_, world(), q);
    m.note = d.plan().spill ? "spilled" : "no spill";
    return m;
  }
  Measured run_pipelined(ChunkMembership membership) {
    const auto q = pipeline_params(membership);
    schedules::PipelinedLlepDispatch d(*backend_, stream(), *comm_, dtype_, args_.experts, q);
    Measured m = measure("pipelined_llep", d, measure::Recompute::plan_only);
    m.membership = membership == ChunkMembership::strided ? "strided" : "contiguous";
    m.bound = schedules::pipelined_llep_dispatch_bytes(args_.tokens, args_.top_k, args_.hidden,
                                                       args_.ffn, dtype_, world(), q);
    int64_t spilled = 0;
    for (const auto& plan : d.plans()) spilled += plan.spill;
    m.note = std::to_string(spilled) + "/" + std::to_string(d.plans().size()) + " chunks spilled";
    return m;
  }

  double max_over_ranks(double v) { return measure::max_over_ranks(*comm_, *backend_, v); }

 private:
  Stream& stream() { return backend_->default_stream(); }

  // Warm-up and timed repetitions (with --recompute, `recompute` between forward and backward).
  Measured measure(const std::string& schedule, schedules::ExpertDispatch& d,
                   measure::Recompute recompute) {
    Measured m;
    m.schedule = schedule;
    m.run = layer_.run(d, args_.common.warmup, args_.common.iters,
                       args_.recompute ? recompute : measure::Recompute::off, true);
    m.time_s = median(m.run.times);
    m.stats = m.run.stats;
    return m;
  }

  const DispatchBenchArgs& args_;
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Comm> comm_;
  measure::DispatchLayer layer_;
};

int run_bench_dispatch(const DispatchBenchArgs& args, const Context& ctx, const RankInfo& ranks) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  DispatchBench bench(args, cfg, ranks);
  const int W = bench.world();
  const bool root = bench.rank() == 0;
  const int64_t N = args.tokens, k = args.top_k;
  const auto pq = bench.pipeline_params(ChunkMembership::strided);
  const auto shape =
      schedules::pipelined_llep_shape(N, k, args.hidden, args.ffn, bench.dtype(), W, pq);
  const uint64_t paper_bound =
      2ull * W * k * shape.chunk_tokens * args.hidden * dtype_size(bench.dtype());
  const uint64_t bound_with_metadata =
      schedules::pipelined_llep_bound_bytes(N, k, args.hidden, args.ffn, bench.dtype(), W, pq);
  if (root) {
    std::printf("# moepeak bench dispatch: %s\n", bench.describe().c_str());
    std::printf(
        "# host %s, %s; world %d; per rank N = %lld tokens, H = %lld, F = %lld, E = %lld "
        "experts, top-%lld, %s routing%s, %s\n",
        process_host().c_str(), now_utc().c_str(), W, static_cast<long long>(N),
        static_cast<long long>(args.hidden), static_cast<long long>(args.ffn),
        static_cast<long long>(args.experts), static_cast<long long>(k), args.routing.c_str(),
        args.routing == "zipf" || args.routing == "segments"
            ? (" (s = " + std::to_string(args.zipf_s) +
               (args.routing == "segments" ? ", " + std::to_string(args.segments) + " segments"
                                           : "") +
               ")")
                  .c_str()
            : "",
        args.dtype.c_str());
    std::printf(
        "# LLEP: alpha %.3g, lambda %.3g, min_tokens_per_gemm %lld; pipeline: c = %lld, "
        "K_max = %lld -> K = %lld, c_eff = %lld, M_c = %lld rows sent, R_c = %lld rows "
        "received per chunk; 2*Ep*k*c_eff*H*b = %s\n",
        args.alpha, args.lambda, static_cast<long long>(args.min_tokens),
        static_cast<long long>(bench.chunk_tokens()), static_cast<long long>(args.max_chunks),
        static_cast<long long>(shape.chunks), static_cast<long long>(shape.chunk_tokens),
        static_cast<long long>(shape.rows_per_source), static_cast<long long>(shape.receive_rows),
        format_bytes(paper_bound).c_str());
    std::printf(
        "# pipeline slots S = %lld (%s), expert tiles of T = %lld rows in %lld F blocks of "
        "%lld; bound with the per-chunk metadata %s (pipelined_llep_bound_bytes)%s\n",
        static_cast<long long>(shape.slots),
        shape.slots == 3   ? "next chunk's dispatch and last chunk's return at once"
        : shape.slots == 2 ? "next chunk's dispatch and last chunk's return overlapped"
                           : "no overlap",
        static_cast<long long>(shape.tile_rows), static_cast<long long>(shape.ffn_blocks),
        static_cast<long long>(shape.ffn_block), format_bytes(bound_with_metadata).c_str(),
        shape.bounded ? "" : "; rows over it (max(alpha, lambda) near W or tiny rows)");
    std::printf(
        "# time: median of %d (after %d warm-up) of %s, max over ranks; peaks: measured, "
        "max over ranks\n",
        args.common.iters, args.common.warmup,
        args.recompute ? "forward + checkpoint recompute + backward" : "forward + backward");
    std::printf("# %-15s %-10s %10s %12s %12s %12s %12s  %s\n", "schedule", "chunks", "time_s",
                "dispatch", "bound", "peak_total", "max_rel_err", "plan");
  }
  std::vector<Measured> rows;
  rows.push_back(bench.run_standard());
  rows.push_back(bench.run_llep());
  rows.push_back(bench.run_pipelined(ChunkMembership::strided));
  rows.push_back(bench.run_pipelined(ChunkMembership::contiguous));
  const Measured& ref = rows.front();

  nlohmann::json json_rows = nlohmann::json::array();
  std::vector<double> times, dispatch_peaks;
  for (const Measured& m : rows) {
    const bool is_ref = &m == &ref;
    double err = 0;
    if (!is_ref) {
      err = std::max({max_scaled_err(m.run.out, ref.run.out), max_scaled_err(m.run.dx, ref.run.dx),
                      max_scaled_err(m.run.dweight, ref.run.dweight),
                      max_scaled_err(m.run.dw, ref.run.dw)});
    }
    err = bench.max_over_ranks(err);
    const double time_s = bench.max_over_ranks(m.time_s);
    auto max_bytes = [&](uint64_t v) {  // byte counts are far below 2^53: exact as doubles
      return static_cast<uint64_t>(bench.max_over_ranks(static_cast<double>(v)));
    };
    const uint64_t total = max_bytes(m.stats.peak_total());
    nlohmann::json peak = {{"total", total}};
    for (LiveSet s : kAllLiveSets) {
      peak[std::string(live_set_name(s))] = max_bytes(m.stats.peak_per_set()[s]);
    }
    const uint64_t dispatch = peak["dispatch"].get<uint64_t>();
    const uint64_t bound = max_bytes(m.bound);
    times.push_back(time_s);
    dispatch_peaks.push_back(static_cast<double>(dispatch));
    if (!root) continue;
    std::printf("  %-15s %-10s %10.4f %12s %12s %12s %12.3g  %s\n", m.schedule.c_str(),
                m.membership.empty() ? "-" : m.membership.c_str(), time_s,
                format_bytes(dispatch).c_str(), format_bytes(bound).c_str(),
                format_bytes(total).c_str(), err, m.note.c_str());
    nlohmann::json row = {{"schedule", m.schedule},
                          {"time_s", time_s},
                          {"peak_bytes", peak},
                          {"bound_bytes", bound},
                          {"max_rel_err", err}};
    if (!m.membership.empty()) row["membership"] = m.membership;
    if (!m.note.empty()) row["plan"] = m.note;
    json_rows.push_back(row);
  }
  if (!root) return 0;
  std::printf(
      "# pipelined_llep (strided) vs llep: dispatch peak %.1f%% lower, time x%.3f; "
      "strided vs contiguous: time x%.3f\n",
      100.0 * (1.0 - dispatch_peaks[2] / dispatch_peaks[1]), times[2] / times[1],
      times[2] / times[3]);
  if (!args.common.json_path.empty()) {
    nlohmann::json js = {{"tokens_per_rank", N},
                         {"hidden_size", args.hidden},
                         {"intermediate_size", args.ffn},
                         {"num_experts", args.experts},
                         {"top_k", k},
                         {"routing", args.routing},
                         {"dtype", args.dtype},
                         {"chunk_tokens", bench.chunk_tokens()},
                         {"max_chunks", args.max_chunks},
                         {"chunks", shape.chunks},
                         {"chunk_tokens_effective", shape.chunk_tokens},
                         {"receive_rows_per_chunk", shape.receive_rows},
                         {"slots", shape.slots},
                         {"tile_rows", shape.tile_rows},
                         {"ffn_blocks", shape.ffn_blocks},
                         {"ffn_block", shape.ffn_block},
                         {"bounded", shape.bounded},
                         {"paper_bound_bytes", paper_bound},
                         {"bound_with_metadata_bytes", bound_with_metadata},
                         {"llep_alpha", args.alpha},
                         {"llep_lambda", args.lambda},
                         {"min_tokens_per_gemm", args.min_tokens},
                         {"recompute", args.recompute}};
    if (args.routing == "zipf" || args.routing == "segments") js["zipf_s"] = args.zipf_s;
    if (args.routing == "segments") js["segments"] = args.segments;
    write_bench_json(args.common.json_path, "dispatch", W, js, json_rows);
  }
  return 0;
}

}  // namespace

void register_bench_dispatch(CLI::App& bench, Context& ctx) {
  static DispatchBenchArgs args;
  auto* sub = bench.add_subcommand("dispatch",
                                   "expert dispatch: standard all-to-all vs LLEP vs PipelinedLLEP");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--tokens", args.tokens, "tokens per rank (N)")->check(CLI::PositiveNumber);
  sub->add_option("--hidden", args.hidden, "hidden size (H)")->check(CLI::PositiveNumber);
  sub->add_option("--ffn", args.ffn, "expert width (F, intermediate_size)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--experts", args.experts, "experts (E), a multiple of the world size")
      ->check(CLI::PositiveNumber);
  sub->add_option("--top-k", args.top_k, "experts per token (k)")->check(CLI::PositiveNumber);
  sub->add_option("--chunk-tokens", args.chunk_tokens,
                  "c: tokens per source per chunk; 0 = ceil(N/10)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-chunks", args.max_chunks, "K_max")->check(CLI::PositiveNumber);
  sub->add_option("--routing", args.routing, "balanced, zipf, segments or adversarial")
      ->check(CLI::IsMember({"balanced", "zipf", "segments", "adversarial"}));
  sub->add_option("--segments", args.segments, "position segments of --routing segments")
      ->check(CLI::PositiveNumber);
  sub->add_option("--zipf-s", args.zipf_s, "Zipf exponent of --routing zipf")
      ->check(CLI::PositiveNumber);
  sub->add_option("--lambda", args.lambda, "LLEP's imbalance threshold")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--alpha", args.alpha, "LLEP's per-rank capacity factor")
      ->check(CLI::PositiveNumber);
  sub->add_option("--min-tokens", args.min_tokens, "LLEP's min_tokens_per_gemm")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--slots", args.slots, "PipelinedLLEP's receive slots S (0 = the bound's rule)")
      ->check(CLI::Range(0, 3));
  sub->add_option("--dtype", args.dtype, "f32, bf16 or f64")
      ->check(CLI::IsMember({"f32", "f64", "bf16"}));
  sub->add_flag("--recompute", args.recompute,
                "time forward, checkpoint recompute and backward (a checkpointed layer)");
  sub->callback([&ctx] {
    ctx.action = [&ctx] {
      const RankInfo ranks = join_ranks();
      int rc = run_bench_dispatch(args, ctx, ranks);
      finalize_process_group();
      return rc;
    };
  });
}

}  // namespace moepeak::cli
