// The measurements of `moepeak tune` (cli/tune_cmd.cpp), at the per-rank shapes of the user's
// config on the machine it runs on (the CPU backend in this version), every rank at once:
//
//   dispatch   PipelinedLLEP forward + backward of one MoE layer (N tokens per rank, H, F, E
//              experts, top-k, Zipf-skewed routing s = 1.2) over (c, K_max); the measured
//              `dispatch` peak, checked equal to pipelined_llep_dispatch_bytes
//   optimizer  one OffloadStreamAdamW step of this rank's P parameters (zero_persistent_elements)
//              over (beta, s); the measured staging peak, checked equal to
//              adamw_offload_stream_bytes; the host-link floor 12 B/param at the measured pinned
//              bandwidth (the slower direction)
//   vocab      Ring-DTP forward + backward (N, H, V over the W ranks) for both payloads, each
//              over strips kept from forward to backward K in vocab_kept_grid
//   sco        a model step's forward + backward (this rank's tokens, one rank's model) under
//              standard checkpointing and SCO with host budgets for none, half and all layers
//
// Each point: `warmup` untimed and `repeats` timed repetitions; under W ranks each repetition's
// time is the slowest rank's (max over ranks), peaks too. The grids (dispatch_grid,
// optimizer_grid) are derived from the config and deduplicated by the effective shape, so every
// point measures something different. `tick(text)` is called after every measured point (the
// SCO sweep: after every step of each row).
// Shapes in the file comment of tune_cmd.cpp. Test: ctest -R test_tune
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/tune/select.h"

namespace moepeak::measure {

struct TuneShape {
  int world = 1;
  int64_t tokens = 0;  // N = batch_size * seq_len / W
  int64_t hidden = 0, ffn = 0, experts = 0, top_k = 0, vocab = 0, layers = 0;
  int64_t params = 0;                      // P: this rank's parameters (zero_persistent_elements)
  int64_t sco_batch = 0, sco_seq_len = 0;  // this rank's tokens as one rank's batch x seq_len
};
// Error (naming the key) when the config cannot be laid out on `world` ranks.
TuneShape tune_shape(const Config& cfg, int world);

struct SweepRun {
  int warmup = 1, repeats = 5;
  std::function<void(const std::string&)> tick;
};

// (c, K_max): c in {N, N/2, ..., N/(2*K_max)} (>= 1) for K_max in {configured, 2 x configured},
// the first of each effective (K, c_eff) kept.
std::vector<std::pair<int64_t, int64_t>> dispatch_grid(const Config& cfg, const TuneShape& shape);
// (beta, s): beta in {b/8, b/4, b/2, b, 2b} with b = min(bucket_params, P rounded up to a power of
// two), s in {2, 3, 4}, the first of each effective (bucket, slots) kept.
std::vector<std::pair<int64_t, int64_t>> optimizer_grid(const Config& cfg, const TuneShape& shape);

std::vector<tune::DispatchPoint> sweep_dispatch(
    const Config& cfg, const RankInfo& ranks, const TuneShape& shape,
    const std::vector<std::pair<int64_t, int64_t>>& grid, const SweepRun& run);

struct OptimizerSweep {
  std::vector<tune::OptimizerPoint> points;
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  double floor_s = 0;  // 12 B/param over the slower direction
};
OptimizerSweep sweep_optimizer(const Config& cfg, const RankInfo& ranks, const TuneShape& shape,
                               const std::vector<std::pair<int64_t, int64_t>>& grid,
                               const SweepRun& run);

// K (schedules.vocab_kept_strips) in {0, S/4, S/2, 3S/4, S}, rounded up and deduplicated, with
// S = the fewest strips a rank forms in a pass under `payload` (ring_dtp_strip_count with the
// configured vocab_strip); error when V < W. The caller drops the K > 0 the plan rejects before
// measuring (a kept strip costs N x strip logits of device memory). sweep_vocab takes its grid.
std::vector<int64_t> vocab_kept_grid(const Config& cfg, const TuneShape& shape,
                                     VocabPayload payload);
// One point per (payload, K) of `grid`, in its order.
std::vector<tune::VocabPoint> sweep_vocab(const Config& cfg, const RankInfo& ranks,
                                          const TuneShape& shape,
                                          const std::vector<std::pair<VocabPayload, int64_t>>& grid,
                                          const SweepRun& run);

struct ScoSweepResult {
  tune::Timing standard;               // standard checkpointing, the reference of the overheads
  uint64_t standard_boundaries = 0;    // its measured `boundaries` peak
  std::vector<tune::ScoPoint> points;  // none, half, all
};
ScoSweepResult sweep_sco(const Config& cfg, const RankInfo& ranks, const TuneShape& shape,
                         const SweepRun& run);

// The ticks of the SCO sweep (the progress bar's total): one per row's step (standard + 3
// budgets, warm-up included: a step of a big model takes a while).
inline int sco_ticks(const SweepRun& run) { return 4 * (run.warmup + run.repeats); }

}  // namespace moepeak::measure
