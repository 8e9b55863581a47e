// The measurements of `moepeak tune` (sweeps.h). The optimizer, vocab and SCO sweeps run the
// benches' own measurement code (adamw_measure.h, vocab_measure.h, sco_measure.h); the dispatch
// sweep drives the PipelinedLLEP library API directly (one MoE layer's forward + backward).
// Test: ctest -R test_tune
#include "core/measure/sweeps.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/measure/adamw_measure.h"
#include "core/measure/dispatch_layer.h"
#include "core/measure/harness.h"
#include "core/measure/sco_measure.h"
#include "core/measure/vocab_measure.h"
#include "core/model/decoder.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/checkpoint_sco.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::measure {
namespace {

// The backend a sweep rank measures on: as the benches' (runtime.backend), on the CPU with at
// least the CPU default capacity — the measurement is not what the plan judges (a config whose
// plan fits nothing must still be measurable, so that the error names the measured points). A
// GPU's arena is the card's free memory less the reserve unless runtime.device_memory says less.
BackendOptions sweep_backend_options(const Config& cfg, const RankInfo& ranks) {
  BackendOptions o = bench_any_backend_options(cfg, ranks);
  if (o.kind == BackendKind::cpu) {
    o.device_memory = std::max<uint64_t>(o.device_memory, Backend::kCpuDefaultDeviceMemory);
  }
  return o;
}

// cfg with runtime.device_memory set to the sweeps' arena on the CPU (unchanged on a GPU), for
// the measurements that build their backend from a config.
Config sweep_config(const Config& cfg, const RankInfo& ranks) {
  Config c = cfg;
  const BackendOptions o = sweep_backend_options(cfg, ranks);
  if (o.kind == BackendKind::cpu) c.runtime.device_memory = std::to_string(o.device_memory);
  return c;
}

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

TuneShape tune_shape(const Config& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  try {
    DecoderModel::check_layout(m, B, T, world);
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR("tune: this config cannot be laid out on W = ", world,
                        " ranks: ", nested_message(e));
  }
  TuneShape s;
  s.world = world;
  s.tokens = B * T / world;
  s.hidden = m.hidden_size;
  s.ffn = m.expert_intermediate_size();
  s.experts = m.num_local_experts;
  s.top_k = m.num_experts_per_tok;
  s.vocab = m.vocab_size;
  s.layers = m.num_hidden_layers;
  s.params = zero_persistent_elements(m, world, lm_head_sharding(cfg.schedules.vocab));
  // This rank's N tokens as one rank's batch: whole sequences when B splits over W, else one
  // sequence of N positions.
  if (B % world == 0) {
    s.sco_batch = B / world;
    s.sco_seq_len = T;
  } else {
    s.sco_batch = 1;
    s.sco_seq_len = s.tokens;
  }
  return s;
}

std::vector<std::pair<int64_t, int64_t>> dispatch_grid(const Config& cfg, const TuneShape& s) {
  const auto base = schedules::pipelined_llep_params(cfg.schedules);
  std::vector<std::pair<int64_t, int64_t>> grid;
  std::set<std::pair<int64_t, int64_t>> seen;  // effective (K, c_eff)
  for (int64_t kmax : {base.max_chunks, 2 * base.max_chunks}) {
    for (int64_t div = 1; div <= 2 * kmax; div *= 2) {
      const int64_t c = std::max<int64_t>(1, s.tokens / div);
      auto q = base;
      q.chunk_tokens = c;
      q.max_chunks = kmax;
      const auto shape = schedules::pipelined_llep_shape(s.tokens, s.top_k, s.world, q);
      if (seen.insert({shape.chunks, shape.chunk_tokens}).second) grid.push_back({c, kmax});
      if (c == 1) break;
    }
  }
  return grid;
}

std::vector<std::pair<int64_t, int64_t>> optimizer_grid(const Config& cfg, const TuneShape& s) {
  const int64_t b =
      std::min(cfg.optimizer.bucket_params, next_pow2(std::max<int64_t>(s.params, 1)));
  std::vector<std::pair<int64_t, int64_t>> grid;
  std::set<std::pair<int64_t, int64_t>> seen;  // effective (bucket, slots)
  for (int64_t slots : {2, 3, 4}) {
    for (int64_t beta : {b / 8, b / 4, b / 2, b, 2 * b}) {
      if (beta < 1) continue;
      const auto shape = schedules::offload_stream_shape(s.params, beta, slots);
      if (seen.insert({shape.bucket, shape.slots}).second) grid.push_back({beta, slots});
    }
  }
  return grid;
}

std::vector<tune::DispatchPoint> sweep_dispatch(
    const Config& cfg, const RankInfo& ranks, const TuneShape& s,
    const std::vector<std::pair<int64_t, int64_t>>& grid, const SweepRun& run) {
  auto backend = Backend::create(sweep_backend_options(cfg, ranks));
  auto comm = make_comm(*backend, ranks);
  // Zipf-skewed routing (p(e) ~ 1 / (e + 1)^1.2, the hot experts rank 0's).
  DispatchLayer layer(*backend, *comm,
                      {s.tokens, s.hidden, s.ffn, s.experts, s.top_k, DType::f32, "zipf", 1.2, 1});
  std::vector<tune::DispatchPoint> points;
  for (const auto& [c, kmax] : grid) {
    auto q = schedules::pipelined_llep_params(cfg.schedules);
    q.chunk_tokens = c;
    q.max_chunks = kmax;
    schedules::PipelinedLlepDispatch d(*backend, backend->default_stream(), *comm, DType::f32,
                                       s.experts, q);
    const DispatchRun r = layer.run(d, run.warmup, run.repeats);
    std::vector<double> times = r.times;
    times.push_back(static_cast<double>(r.stats.peak_per_set()[LiveSet::dispatch]));
    max_over_ranks(*comm, *backend, times);
    tune::DispatchPoint p;
    p.chunk_tokens = c;
    p.max_chunks = kmax;
    const auto shape = schedules::pipelined_llep_shape(s.tokens, s.top_k, s.world, q);
    p.chunks = shape.chunks;
    p.chunk_eff = shape.chunk_tokens;
    p.peak_bytes = static_cast<uint64_t>(times.back());
    times.pop_back();
    p.time = tune::summarize(times);
    p.bound_bytes = schedules::pipelined_llep_dispatch_bytes(s.tokens, s.top_k, s.hidden, s.ffn,
                                                             DType::f32, s.world, q);
    MOEPEAK_CHECK(p.peak_bytes == p.bound_bytes, "tune: the measured dispatch peak ", p.peak_bytes,
                  " B (c = ", c, ", K_max = ", kmax,
                  ") differs from pipelined_llep_dispatch_bytes ", p.bound_bytes, " B");
    points.push_back(p);
    if (run.tick) run.tick("dispatch c=" + std::to_string(c) + " K_max=" + std::to_string(kmax));
  }
  return points;
}

OptimizerSweep sweep_optimizer(const Config& cfg, const RankInfo& ranks, const TuneShape& s,
                               const std::vector<std::pair<int64_t, int64_t>>& grid,
                               const SweepRun& run) {
  int64_t max_bucket = 1, max_slots = 1;
  for (const auto& [b, sl] : grid) {
    max_bucket = std::max(max_bucket, b);
    max_slots = std::max(max_slots, sl);
  }
  // NOTES: f32 working weights, as the dispatch sweep's f32 layer: the staging a bucket needs is
  // the fp32 state's whatever the weights (adamw_offload_stream_bytes of the state dtype).
  const BackendOptions bo =
      adamw_backend_options(cfg, ranks, s.params, max_bucket, max_slots, 0, DType::f32);
  auto backend = Backend::create(bo);
  auto comm = make_comm(*backend, ranks);
  Stream& stream = backend->default_stream();
  AdamwParams p = make_adamw_params(*backend, s.params, DType::f32, stream);
  const LinkBandwidth link = pinned_bandwidth(*backend, adamw_bandwidth_bytes(s.params), stream);
  std::vector<double> bw = {-link.h2d, -link.d2h};  // the slowest rank's: max of the negated
  max_over_ranks(*comm, *backend, bw);
  OptimizerSweep out;
  out.h2d_bytes_per_s = -bw[0];
  out.d2h_bytes_per_s = -bw[1];
  const double state = 12.0 * static_cast<double>(s.params);
  out.floor_s = std::max(state / out.h2d_bytes_per_s, state / out.d2h_bytes_per_s);
  for (const auto& [beta, slots] : grid) {
    OptimizerConfig o = cfg.optimizer;
    o.placement = OptimizerPlacement::offload_stream;
    o.bucket_params = beta;
    o.staging_slots = slots;
    reset_adamw_params(*backend, p, stream);
    comm->barrier();
    auto opt = make_adamw(*backend, p, o, adamw_host_threads(bo, ranks));
    AdamwRun r = time_adamw(*backend, p, *opt, run.warmup, run.repeats, stream);
    std::vector<double> times = r.times;
    times.push_back(static_cast<double>(r.peaks.peak_per_set()[LiveSet::optimizer]));
    max_over_ranks(*comm, *backend, times);
    tune::OptimizerPoint pt;
    pt.bucket_params = beta;
    pt.staging_slots = slots;
    const auto shape = schedules::offload_stream_shape(p.elements, beta, slots);
    pt.bucket = shape.bucket;
    pt.slots = shape.slots;
    pt.staging_bytes = static_cast<uint64_t>(times.back());
    times.pop_back();
    pt.time = tune::summarize(times);
    pt.bound_bytes = schedules::adamw_offload_stream_bytes(shape.bucket, shape.slots, DType::f32);
    MOEPEAK_CHECK(pt.staging_bytes == pt.bound_bytes, "tune: the measured optimizer staging ",
                  pt.staging_bytes, " B (beta = ", beta, ", s = ", slots,
                  ") differs from adamw_offload_stream_bytes ", pt.bound_bytes, " B");
    out.points.push_back(pt);
    if (run.tick)
      run.tick("optimizer beta=" + std::to_string(beta) + " s=" + std::to_string(slots));
  }
  return out;
}

std::vector<int64_t> vocab_kept_grid(const Config& cfg, const TuneShape& shape,
                                     VocabPayload payload) {
  MOEPEAK_CHECK(shape.vocab >= shape.world, "tune: Ring-DTP needs model.vocab_size (", shape.vocab,
                ") >= W (", shape.world, ")");
  const int64_t S =
      schedules::ring_dtp_strip_count(shape.vocab, shape.world, cfg.schedules.vocab_strip, payload)
          .fewest;
  std::vector<int64_t> grid;
  for (int64_t quarter = 0; quarter <= 4; ++quarter) {
    const int64_t k = (quarter * S + 3) / 4;
    if (grid.empty() || grid.back() != k) grid.push_back(k);
  }
  return grid;
}

std::vector<tune::VocabPoint> sweep_vocab(const Config& cfg, const RankInfo& ranks,
                                          const TuneShape& s,
                                          const std::vector<std::pair<VocabPayload, int64_t>>& grid,
                                          const SweepRun& run) {
  const Config measure_cfg = sweep_config(cfg, ranks);  // as the other sweeps
  VocabShape shape;
  shape.tokens = s.tokens;
  shape.hidden = s.hidden;
  shape.vocab = s.vocab;
  shape.warmup = run.warmup;
  shape.iters = run.repeats;
  VocabBench bench(shape, measure_cfg, ranks);
  std::vector<tune::VocabPoint> points;
  for (const auto& [payload, kept] : grid) {
    VocabMeasured m = bench.run_ring(payload, cfg.schedules.vocab_strip, kept);
    std::vector<double> times = m.times;
    times.push_back(static_cast<double>(m.stats.peak_per_set()[LiveSet::logits]));
    max_over_ranks(bench.comm(), bench.backend(), times);
    tune::VocabPoint p;
    p.payload = std::string(enum_name(payload));
    p.kept_strips = m.kept;
    p.peak_bytes = static_cast<uint64_t>(times.back());
    times.pop_back();
    p.time = tune::summarize(times);
    p.bound_bytes = m.bound;
    MOEPEAK_CHECK(p.peak_bytes == p.bound_bytes, "tune: the measured logits peak ", p.peak_bytes,
                  " B (", p.payload, ", ", kept, " kept strips) differs from ring_dtp_bytes ",
                  p.bound_bytes, " B");
    points.push_back(p);
    if (run.tick) run.tick("vocab payload=" + p.payload + " kept=" + std::to_string(kept));
  }
  return points;
}

ScoSweepResult sweep_sco(const Config& cfg, const RankInfo& ranks, const TuneShape& s,
                         const SweepRun& run) {
  const Config c = sweep_config(cfg, ranks);
  const BackendOptions bo = sco_backend_options(c, ranks, s.sco_batch, s.sco_seq_len);
  auto backend = Backend::create(bo);
  auto world = make_comm(*backend, ranks);  // for the max over ranks; the models run alone
  world->barrier();
  ScoSweep sweep = measure_sco_sweep(*backend, c, s.sco_batch, s.sco_seq_len, run.warmup,
                                     run.repeats, [&](const std::string& label) {
                                       if (run.tick) run.tick("sco " + label);
                                     });
  ScoSweepResult out;
  const int64_t N = s.sco_batch * s.sco_seq_len;
  std::vector<double> standard_times;
  for (const ScoRow& r : sweep.rows) {
    std::vector<double> times = r.times;
    times.push_back(static_cast<double>(r.device.peak_per_set()[LiveSet::boundaries]));
    max_over_ranks(*world, *backend, times);
    const uint64_t peak = static_cast<uint64_t>(times.back());
    times.pop_back();
    if (r.checkpoint == CheckpointSchedule::standard) {
      out.standard = tune::summarize(times);
      out.standard_boundaries = peak;
    } else {
      tune::ScoPoint p;
      p.label = r.label.substr(r.label.find(' ') + 1);  // "none", "half", "all"
      p.offloaded_layers = r.offloaded;
      p.host_budget = r.host_budget.value_or(0);
      p.time = tune::summarize(times);
      p.peak_bytes = peak;
      p.bound_bytes =
          schedules::sco_boundaries_bytes(s.layers, r.offloaded, N, s.hidden, DType::f32);
      out.points.push_back(p);
    }
  }
  for (tune::ScoPoint& p : out.points) p.overhead = p.time.median_s / out.standard.median_s - 1;
  return out;
}

}  // namespace moepeak::measure
