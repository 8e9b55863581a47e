// Measuring the vocabulary projection + cross-entropy (forward and backward) on W ranks, shared
// by `moepeak bench vocab` (cli/bench_vocab.cpp) and `moepeak tune`'s payload sweep
// (core/measure/sweeps.cpp): the materialised schedule and Ring-DTP (either payload, any strip
// width) on the same per-rank batches.
//
//   VocabBench bench({N, H, V, "f32", warmup, iters}, cfg, ranks);   // collective
//   VocabMeasured m = bench.run_ring(VocabPayload::weights, strip, kept);  // times, stats, bound
//
// N is tokens per rank (each rank its own distinct batch); inputs are seeded, so every run sees
// the same values. Only runtime.device_memory / runtime.threads of the config are read.
// Test: ctest -R bench_vocab, test_tune.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/measure/harness.h"
#include "core/runtime/backend.h"
#include "core/runtime/memory_stats.h"
#include "core/runtime/tensor.h"
#include "ops/fill.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::measure {

struct VocabShape {
  int64_t tokens = 2048;  // N per rank
  int64_t hidden = 256;
  int64_t vocab = 16384;
  std::string dtype = "f32";  // or "f64"
  int warmup = 2, iters = 5;
};

// One schedule's row as this rank measured it.
struct VocabMeasured {
  std::string schedule, payload;
  int64_t strip = 0;
  int64_t kept = 0;           // strips kept from forward to backward (as the schedule resolved)
  double time_s = 0;          // median of `times`
  std::vector<double> times;  // the timed repetitions
  MemoryStats stats;
  uint64_t bound = 0;
  double loss = 0;
  std::vector<double> dx, dw;  // (N, H), this rank's rows of dW (V_r, H)
};

class VocabBench {
 public:
  VocabBench(const VocabShape& args, const Config& cfg, const RankInfo& ranks)
      : args_(args),
        dtype_(bench_dtype(args.dtype)),
        backend_(Backend::create(bench_any_backend_options(cfg, ranks))),
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
    std::vector<int64_t> labels(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      labels[n] = coin(rng) < 0.1 ? -100 : pick(rng);
      scored += labels[n] != -100;
    }
    backend_->copy_async(labels_.data(), labels.data(), labels.size() * 8, CopyKind::host_to_device,
                         stream());
    stream().synchronize();
    std::vector<double> count = {static_cast<double>(scored)};
    all_reduce_host(*comm_, *backend_, stream(), count);
    loss_scale_ = 1.0 / count[0];
    dx_ = tensor(Shape{N, H}, LiveSet::workspace, "bench dx");
    // The LM head's gradient in the model's gradient dtype (fp32 beside bf16).
    dw_full_ = OwnedTensor::device(*backend_, Shape{V, H}, schedules::main_grad_dtype(dtype_),
                                   LiveSet::grads, "bench dlm_head");
  }

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }
  DType dtype() const { return dtype_; }
  Stream& stream() { return backend_->default_stream(); }
  std::string describe() const { return backend_->describe(); }

  VocabMeasured run_materialized() {
    VocabMeasured m;
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
                      dw_full_.view().dtype(), ReduceOp::sum, stream());
    m.dw = read(dw_full_.view().rows(shard_.begin, shard_.end));
    return m;
  }

  VocabMeasured run_ring(VocabPayload payload, int64_t strip, int64_t kept = 0) {
    VocabMeasured m;
    m.schedule = "ring_dtp";
    m.payload = payload == VocabPayload::weights ? "weights" : "activations";
    m.strip = strip;
    const schedules::RingDtpBytes bytes = schedules::ring_dtp_memory(
        args_.tokens, args_.hidden, args_.vocab, world(), strip, kept, payload, dtype_);
    m.bound = bytes.peak();
    m.kept = bytes.kept_strips;
    schedules::RingDtpVocab vocab(*backend_, stream(), *comm_, dtype_, args_.vocab, payload, strip,
                                  kept);
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
  double max_over_ranks(double v) { return measure::max_over_ranks(*comm_, *backend_, v); }
  Comm& comm() { return *comm_; }
  Backend& backend() { return *backend_; }

 private:
  OwnedTensor tensor(Shape shape, LiveSet set, const char* what) {
    return OwnedTensor::device(*backend_, shape, dtype_, set, what);
  }
  // Values drawn on the host in element order, written in the tensor's dtype (any backend;
  // repeating past kHostElements, harness.h).
  template <typename F>
  void fill(const OwnedTensor& t, F&& next) {
    fill_seeded(t, *backend_, next);
  }
  // Every row, or at GPU shapes sampled rows (harness.h): what the errors are computed over.
  std::vector<double> read(const Tensor& t) { return read_sampled_rows(t, *backend_, stream()); }

  // Warm-up and timed repetitions of `step` (forward + backward, synchronised), each started
  // together on every rank, dW zeroed before each; the peaks cover all of them.
  template <typename F>
  void time_rows(VocabMeasured& m, F&& step) {
    std::vector<double> times;
    backend_->arena().reset_peaks();
    for (int i = 0; i < args_.warmup + args_.iters; ++i) {
      ops::fill(dw_full_, 0.0, stream());
      stream().synchronize();
      comm_->barrier();
      auto t0 = std::chrono::steady_clock::now();
      step();
      auto t1 = std::chrono::steady_clock::now();
      if (i >= args_.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    m.times = times;
    m.time_s = median(times);
    m.stats = backend_->arena().stats();
  }

  VocabShape args_;
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Comm> comm_;
  schedules::VocabInterval shard_;
  OwnedTensor x_, lm_head_, labels_, dx_, dw_full_;
  double loss_scale_ = 1;
};

}  // namespace moepeak::measure
