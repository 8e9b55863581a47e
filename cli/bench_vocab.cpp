// `moepeak bench vocab`: the vocabulary projection + cross-entropy, forward and backward, of the
// materialised schedule (each rank forms its batch's (N, V) logits against the whole LM head)
// beside Ring-DTP (each rank owns V/P rows; both payloads, several strip widths, optionally
// strips kept from forward to backward) on the same
// per-rank batches. Each row: the median time of forward + backward, the measured peak of every
// live set (the `logits` set is the one the schedules differ in), the formula's bound for that
// set (vocab_materialized_bytes / ring_dtp_bytes), and the largest relative error against the
// materialised row over the loss, dx and this rank's dW rows.
//
//   mpirun -np W moepeak bench vocab [--tokens N] [--hidden H] [--vocab V] [--strips 0,1024,256]
//                                    [--kept 0] [--dtype f32|f64|bf16] [--warmup 2] [--iters 5]
//                                    [--json FILE]
//
// N is tokens per rank (each rank its own distinct batch). Rank 0 prints and writes the JSON;
// times and peaks are the maximum over ranks, errors too. --config/--set only feed the runtime
// section (backend, device_memory, threads): with runtime.backend = "cuda" (or "auto" and a GPU)
// it runs on the rank's GPU, where --dtype bf16 is the GPU's storage dtype.
//
// Test: ctest -R bench_vocab (2 ranks, a small shape: the JSON's rows, bounds and errors);
// results in docs/perf.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/measure/vocab_measure.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/fill.h"
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::cli {

using namespace measure;  // the measurement this command prints (core/measure)
namespace {

struct VocabBenchArgs {
  BenchCommonArgs common;
  VocabShape shape;
  std::vector<int64_t> strips = {0, 1024, 256};
  std::vector<int64_t> kept = {0};  // schedules.vocab_kept_strips values, each with every strip
};

int run_bench_vocab(const VocabBenchArgs& args, const Context& ctx, const RankInfo& ranks) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  VocabShape shape = args.shape;
  shape.warmup = args.common.warmup;
  shape.iters = args.common.iters;
  VocabBench bench(shape, cfg, ranks);
  const int W = bench.world();
  const bool root = bench.rank() == 0;
  const int64_t N = shape.tokens, H = shape.hidden, V = shape.vocab;
  const uint64_t nv_bytes = static_cast<uint64_t>(N * V) * dtype_size(bench.dtype());
  if (root) {
    std::printf("# moepeak bench vocab: %s\n", bench.describe().c_str());
    std::printf(
        "# host %s, %s; world %d; per rank N = %lld tokens, H = %lld, V = %lld (shards of "
        "%lld..%lld rows), %s; auto payload: %s\n",
        process_host().c_str(), now_utc().c_str(), W, static_cast<long long>(N),
        static_cast<long long>(H), static_cast<long long>(V), static_cast<long long>(V / W),
        static_cast<long long>((V + W - 1) / W), shape.dtype.c_str(),
        schedules::ring_dtp_resolve_payload(VocabPayload::automatic, N, V, W) ==
                VocabPayload::weights
            ? "weights"
            : "activations");
    std::printf(
        "# time: median of %d (after %d warm-up) of forward + backward, max over ranks; "
        "logits: measured peak of the live set, max over ranks; N*V*b = %s\n",
        args.common.iters, args.common.warmup, format_bytes(nv_bytes).c_str());
    std::printf("# %-12s %-11s %6s %5s %10s %12s %12s %8s %12s %12s\n", "schedule", "payload",
                "strip", "kept", "time_s", "logits", "bound", "/N*V*b", "peak_total",
                "max_rel_err");
  }

  // Each Ring-DTP row is compared with the materialised one as soon as it is measured and its
  // read-backs dropped: at the GPU shape one row's dW alone is V*H doubles (11.5 GB).
  std::vector<VocabMeasured> rows;
  std::vector<double> errors;
  rows.push_back(bench.run_materialized());
  errors.push_back(0);
  const double ref_loss = bench.sum_over_ranks(rows.front().loss);
  for (VocabPayload payload : {VocabPayload::activations, VocabPayload::weights}) {
    for (int64_t strip : args.strips) {
      for (int64_t kept : args.kept) {
        VocabMeasured m = bench.run_ring(payload, strip, kept);
        const VocabMeasured& ref = rows.front();
        const double loss = bench.sum_over_ranks(m.loss);
        errors.push_back(std::max({std::abs(loss - ref_loss) / std::abs(ref_loss),
                                   max_scaled_err(m.dx, ref.dx), max_scaled_err(m.dw, ref.dw)}));
        m.dx = {};
        m.dw = {};
        rows.push_back(std::move(m));
      }
    }
  }
  nlohmann::json json_rows = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const VocabMeasured& m = rows[i];
    const bool is_ref = i == 0;
    const double err = bench.max_over_ranks(errors[i]);
    const double time_s = bench.max_over_ranks(m.time_s);
    // Byte counts are far below 2^53: exact through a double reduction.
    auto max_bytes = [&](uint64_t v) {
      return static_cast<uint64_t>(bench.max_over_ranks(static_cast<double>(v)));
    };
    const uint64_t total = max_bytes(m.stats.peak_total());
    nlohmann::json peak = {{"total", total}};
    for (LiveSet s : kAllLiveSets) {
      peak[std::string(live_set_name(s))] = max_bytes(m.stats.peak_per_set()[s]);
    }
    const uint64_t logits = peak["logits"].get<uint64_t>();
    if (!root) continue;
    std::printf("  %-12s %-11s %6s %5s %10.4f %12s %12s %8.4f %12s %12.3g\n", m.schedule.c_str(),
                m.payload.empty() ? "-" : m.payload.c_str(),
                is_ref ? "-" : (m.strip == 0 ? "shard" : std::to_string(m.strip).c_str()),
                is_ref ? "-" : std::to_string(m.kept).c_str(), time_s, format_bytes(logits).c_str(),
                format_bytes(m.bound).c_str(),
                static_cast<double>(logits) / static_cast<double>(nv_bytes),
                format_bytes(total).c_str(), err);
    nlohmann::json row = {{"schedule", m.schedule},
                          {"time_s", time_s},
                          {"peak_bytes", peak},
                          {"bound_bytes", m.bound},
                          {"max_rel_err", err}};
    if (!is_ref) {
      row["payload"] = m.payload;
      row["strip"] = m.strip;
      row["strip_columns"] = schedules::ring_dtp_strip_columns(V, W, m.strip);
      row["kept_strips"] = m.kept;
    }
    json_rows.push_back(row);
  }
  if (root && !args.common.json_path.empty()) {
    nlohmann::json js = {
        {"tokens_per_rank", N}, {"hidden_size", H}, {"vocab_size", V}, {"dtype", shape.dtype}};
    write_bench_json(args.common.json_path, "vocab", W, js, json_rows);
  }
  return 0;
}

}  // namespace

void register_bench_vocab(CLI::App& bench, Context& ctx) {
  static VocabBenchArgs args;
  auto* vocab = bench.add_subcommand(
      "vocab", "vocabulary projection + cross-entropy: materialised logits vs Ring-DTP");
  add_bench_common_options(*vocab, args.common);
  vocab->add_option("--tokens", args.shape.tokens, "tokens per rank (N)")
      ->check(CLI::PositiveNumber);
  vocab->add_option("--hidden", args.shape.hidden, "hidden size (H)")->check(CLI::PositiveNumber);
  vocab->add_option("--vocab", args.shape.vocab, "vocabulary size (V), at least the world size")
      ->check(CLI::PositiveNumber);
  vocab->add_option("--strips", args.strips, "Ring-DTP strip widths in columns, 0 = whole shard")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  vocab
      ->add_option("--kept", args.kept,
                   "Ring-DTP strips kept from forward to backward (each value with every strip "
                   "width; more than a rank forms keeps them all)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  vocab->add_option("--dtype", args.shape.dtype, "f32 or f64; bf16 on CUDA")
      ->check(CLI::IsMember({"f32", "f64", "bf16"}));
  vocab->callback([&ctx] {
    ctx.action = [&ctx] {
      const RankInfo ranks = join_ranks();
      int rc = run_bench_vocab(args, ctx, ranks);
      finalize_process_group();
      return rc;
    };
  });
}

}  // namespace moepeak::cli
