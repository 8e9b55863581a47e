// `moepeak bench vocab`: the vocabulary projection + cross-entropy, forward and backward, of the
// materialised schedule (each rank forms its batch's (N, V) logits against the whole LM head)
// beside Ring-DTP (each rank owns V/P rows; both payloads, several strip widths) on the same
// per-rank batches. Each row: the median time of forward + backward, the measured peak of every
// live set (the `logits` set is the one the schedules differ in), the formula's bound for that
// set (vocab_materialized_bytes / ring_dtp_bytes), and the largest relative error against the
// materialised row over the loss, dx and this rank's dW rows.
//
//   mpirun -np W moepeak bench vocab [--tokens N] [--hidden H] [--vocab V] [--strips 0,1024,256]
//                                    [--dtype f32|f64] [--warmup 2] [--iters 5] [--json FILE]
//
// N is tokens per rank (each rank its own distinct batch). Rank 0 prints and writes the JSON;
// times and peaks are the maximum over ranks, errors too. --config/--set only feed the runtime
// section (device_memory, threads).
//
// Test: ctest -R bench_vocab (2 ranks, a small shape: the JSON's rows, bounds and errors);
// results in docs/perf.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/fill.h"
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::cli {
namespace {

struct VocabBenchArgs {
  BenchCommonArgs common;
  int64_t tokens = 2048;
  int64_t hidden = 256;
  int64_t vocab = 16384;
  std::vector<int64_t> strips = {0, 1024, 256};
  std::string dtype = "f32";
};

// One schedule's row as this rank measured it.
struct Measured {
  std::string schedule, payload;
  int64_t strip = 0;
  double time_s = 0;
  MemoryStats stats;
  uint64_t bound = 0;
  double loss = 0;
  std::vector<double> dx, dw;  // (N, H), this rank's rows of dW (V_r, H)
};

class VocabBench {
 public:
  VocabBench(const VocabBenchArgs& args, const Config& cfg, const RankInfo& ranks)
      : args_(args),
        dtype_(args.dtype == "f64" ? DType::f64 : DType::f32),
        backend_(Backend::create(bench_backend_options(cfg, ranks))),
        comm_(make_comm(*backend_, ranks)),
        shard_(schedules::vocab_shard(args.vocab, ranks.world_size, ranks.rank)) {
    const int64_t N = args.tokens, H = args.hidden, V = args.vocab;
    // Inputs every schedule reads: this rank's batch and labels, the whole LM head (the
    // materialised schedule's replica), its rows (Ring-DTP's shard) and the gradients.
    std::mt19937_64 rng(1234 + static_cast<uint64_t>(ranks.rank));
    std::uniform_real_distribution<double> uni(-1.0, 1.0), coin(0.0, 1.0);
    std::uniform_int_distribution<int64_t> pick(0, V - 1);
    x_ = tensor(Shape{N, H}, LiveSet::workspace, "bench x");
    lm_head_ = tensor(Shape{V, H}, LiveSet::weights, "bench lm_head");
    labels_ = OwnedTensor::device(*backend_, Shape{N}, DType::i64, LiveSet::workspace, "labels");
    std::mt19937_64 weight_rng(99);  // the same LM head on every rank
    const double w_scale = 3.0 / std::sqrt(static_cast<double>(H));
    fill(x_, [&] { return uni(rng); });
    fill(lm_head_, [&] { return w_scale * uni(weight_rng); });
    int64_t scored = 0;
    for (int64_t n = 0; n < N; ++n) {
      int64_t l = coin(rng) < 0.1 ? -100 : pick(rng);
      labels_.data_as<int64_t>()[n] = l;
      scored += l != -100;
    }
    std::vector<double> count = {static_cast<double>(scored)};
    all_reduce_host(*comm_, *backend_, stream(), count);
    loss_scale_ = 1.0 / count[0];
    dx_ = tensor(Shape{N, H}, LiveSet::workspace, "bench dx");
    dw_full_ = tensor(Shape{V, H}, LiveSet::grads, "bench dlm_head");
  }

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }
  DType dtype() const { return dtype_; }
  Stream& stream() { return backend_->default_stream(); }
  std::string describe() const { return backend_->describe(); }

  Measured run_materialized() {
    Measured m;
    m.schedule = "materialized";
    m.bound = schedules::vocab_materialized_bytes(args_.tokens, args_.vocab, dtype_);
    schedules::MaterializedVocab vocab(*backend_, stream(), dtype_);
    time_rows(m, [&] {
      m.loss = vocab.forward(x_, lm_head_, labels_, loss_scale_);
      vocab.backward(x_, lm_head_, dx_, dw_full_);
      stream().synchronize();
    });
    m.dx = read(dx_);
    // This rank's batch contributed to every row of dW: the sum over ranks is the whole dW.
    comm_->all_reduce(dw_full_.data(), dw_full_.data(), static_cast<size_t>(dw_full_.numel()),
                      dtype_, ReduceOp::sum, stream());
    m.dw = read(dw_full_.view().rows(shard_.begin, shard_.end));
    return m;
  }

  Measured run_ring(VocabPayload payload, int64_t strip) {
    Measured m;
    m.schedule = "ring_dtp";
    m.payload = payload == VocabPayload::weights ? "weights" : "activations";
    m.strip = strip;
    m.bound = schedules::ring_dtp_bytes(args_.tokens, args_.hidden, args_.vocab, world(), strip,
                                        payload, dtype_);
    schedules::RingDtpVocab vocab(*backend_, stream(), *comm_, dtype_, args_.vocab, payload, strip);
    const Tensor w = lm_head_.view().rows(shard_.begin, shard_.end);
    const Tensor dw = dw_full_.view().rows(shard_.begin, shard_.end);
    time_rows(m, [&] {
      m.loss = vocab.forward(x_, w, labels_, loss_scale_);
      vocab.backward(x_, w, dx_, dw);
    });
    m.dx = read(dx_);
    m.dw = read(dw);
    return m;
  }

  // The job's loss (sum of the ranks' shares) and the maxima over ranks of a double.
  double sum_over_ranks(double v) {
    std::vector<double> values = {v};
    all_reduce_host(*comm_, *backend_, stream(), values);
    return values[0];
  }
  double max_over_ranks(double v) {
    std::vector<double> values = {v};
    all_reduce_host(*comm_, *backend_, stream(), values, ReduceOp::max);
    return values[0];
  }

 private:
  OwnedTensor tensor(Shape shape, LiveSet set, const char* what) {
    return OwnedTensor::device(*backend_, shape, dtype_, set, what);
  }
  template <typename F> void fill(const OwnedTensor& t, F&& next) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype_ == DType::f32) {
        t.data_as<float>()[i] = static_cast<float>(next());
      } else {
        t.data_as<double>()[i] = next();
      }
    }
  }
  std::vector<double> read(const Tensor& t) { return copy_to_host_as_double(t, *backend_, stream()); }

  // Warm-up and timed repetitions of `step` (forward + backward, synchronised), each started
  // together on every rank, dW zeroed before each; the peaks cover all of them.
  template <typename F> void time_rows(Measured& m, F&& step) {
    std::vector<double> times;
    backend_->arena().reset_peaks();
    for (int i = 0; i < args_.common.warmup + args_.common.iters; ++i) {
      ops::fill(dw_full_, 0.0, stream());
      stream().synchronize();
      comm_->barrier();
      auto t0 = std::chrono::steady_clock::now();
      step();
      auto t1 = std::chrono::steady_clock::now();
      if (i >= args_.common.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    m.time_s = median(times);
    m.stats = backend_->arena().stats();
  }

  const VocabBenchArgs& args_;
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Comm> comm_;
  schedules::VocabInterval shard_;
  OwnedTensor x_, lm_head_, labels_, dx_, dw_full_;
  double loss_scale_ = 1;
};

// max |got - want| / max |want|; infinite on a NaN.
double scaled_err(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

int run_bench_vocab(const VocabBenchArgs& args, const Context& ctx, const RankInfo& ranks) {
  MOEPEAK_CHECK(args.dtype == "f32" || args.dtype == "f64", "--dtype ", args.dtype,
                " (f32 or f64)");
  Config cfg = load_config_for_command(args.common.config, ctx);
  VocabBench bench(args, cfg, ranks);
  const int W = bench.world();
  const bool root = bench.rank() == 0;
  const int64_t N = args.tokens, H = args.hidden, V = args.vocab;
  const uint64_t nv_bytes = static_cast<uint64_t>(N * V) * dtype_size(bench.dtype());
  if (root) {
    std::printf("# moepeak bench vocab: %s\n", bench.describe().c_str());
    std::printf("# host %s, %s; world %d; per rank N = %lld tokens, H = %lld, V = %lld (shards of "
                "%lld..%lld rows), %s; auto payload: %s\n",
                process_host().c_str(), now_utc().c_str(), W, static_cast<long long>(N),
                static_cast<long long>(H), static_cast<long long>(V),
                static_cast<long long>(V / W), static_cast<long long>((V + W - 1) / W),
                args.dtype.c_str(),
                schedules::ring_dtp_resolve_payload(VocabPayload::automatic, N, V, W) ==
                        VocabPayload::weights
                    ? "weights"
                    : "activations");
    std::printf("# time: median of %d (after %d warm-up) of forward + backward, max over ranks; "
                "logits: measured peak of the live set, max over ranks; N*V*b = %s\n",
                args.common.iters, args.common.warmup, format_bytes(nv_bytes).c_str());
    std::printf("# %-12s %-11s %6s %10s %12s %12s %8s %12s %12s\n", "schedule", "payload", "strip",
                "time_s", "logits", "bound", "/N*V*b", "peak_total", "max_rel_err");
  }

  std::vector<Measured> rows;
  rows.push_back(bench.run_materialized());
  for (VocabPayload payload : {VocabPayload::activations, VocabPayload::weights}) {
    for (int64_t strip : args.strips) rows.push_back(bench.run_ring(payload, strip));
  }
  const Measured& ref = rows.front();
  const double ref_loss = bench.sum_over_ranks(ref.loss);

  nlohmann::json json_rows = nlohmann::json::array();
  for (const Measured& m : rows) {
    const bool is_ref = &m == &ref;
    double err = 0;
    if (!is_ref) {
      const double loss = bench.sum_over_ranks(m.loss);
      err = std::max({std::abs(loss - ref_loss) / std::abs(ref_loss), scaled_err(m.dx, ref.dx),
                      scaled_err(m.dw, ref.dw)});
    }
    err = bench.max_over_ranks(err);
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
    std::printf("  %-12s %-11s %6s %10.4f %12s %12s %8.4f %12s %12.3g\n", m.schedule.c_str(),
                m.payload.empty() ? "-" : m.payload.c_str(),
                is_ref ? "-" : (m.strip == 0 ? "shard" : std::to_string(m.strip).c_str()), time_s,
                format_bytes(logits).c_str(), format_bytes(m.bound).c_str(),
                static_cast<double>(logits) / static_cast<double>(nv_bytes),
                format_bytes(total).c_str(), err);
    nlohmann::json row = {{"schedule", m.schedule}, {"time_s", time_s}, {"peak_bytes", peak},
                          {"bound_bytes", m.bound}, {"max_rel_err", err}};
    if (!is_ref) {
      row["payload"] = m.payload;
      row["strip"] = m.strip;
      row["strip_columns"] = schedules::ring_dtp_strip_columns(V, W, m.strip);
    }
    json_rows.push_back(row);
  }
  if (root && !args.common.json_path.empty()) {
    nlohmann::json shape = {{"tokens_per_rank", N}, {"hidden_size", H}, {"vocab_size", V},
                            {"dtype", args.dtype}};
    write_bench_json(args.common.json_path, "vocab", W, shape, json_rows);
  }
  return 0;
}

}  // namespace

void register_bench_vocab(CLI::App& bench, Context& ctx) {
  static VocabBenchArgs args;
  auto* vocab = bench.add_subcommand(
      "vocab", "vocabulary projection + cross-entropy: materialised logits vs Ring-DTP");
  add_bench_common_options(*vocab, args.common);
  vocab->add_option("--tokens", args.tokens, "tokens per rank (N)")->check(CLI::PositiveNumber);
  vocab->add_option("--hidden", args.hidden, "hidden size (H)")->check(CLI::PositiveNumber);
  vocab->add_option("--vocab", args.vocab, "vocabulary size (V), at least the world size")
      ->check(CLI::PositiveNumber);
  vocab->add_option("--strips", args.strips, "Ring-DTP strip widths in columns, 0 = whole shard")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  vocab->add_option("--dtype", args.dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}));
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
