// Measuring AdamW placements on one rank's parameters, shared by `moepeak bench adamw`
// (cli/bench_adamw.cpp) and `moepeak tune`'s optimizer sweep (core/measure/sweeps.cpp):
//
//   auto backend = Backend::create(adamw_backend_options(cfg, ranks, count, max_bucket, max_slots,
//                                                        threads, DType::bf16));
//   AdamwParams p = make_adamw_params(*backend, count, DType::bf16, stream);  // 16 pieces
//   auto [h2d, d2h] = pinned_bandwidth(*backend, adamw_bandwidth_bytes(count), stream);
//   auto opt = make_adamw(*backend, p, optimizer_config, threads);
//   // r.times, r.peaks, weights/m/v:
//   AdamwRun r = time_adamw(*backend, p, *opt, warmup, iters, stream);
//
// The parameters are one flat buffer cut into pieces like a model's (every fourth without weight
// decay, as norms are), the same values every time (seeded), so runs of different placements
// compare bitwise. Working weights in f32, or in bf16 as a bf16 run has them (its gradients in
// fp32, schedules::main_grad_dtype, and the optimizer's fp32 master beside them).
// Test: ctest -R bench_adamw, test_tune.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/memory_stats.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::measure {

constexpr int64_t kAdamwPieces = 16;
constexpr int64_t kAdamwAlign = 64;  // elements, as ParamLayout aligns pieces

// The parameters of one rank: a flat weights buffer and its grads, cut into kAdamwPieces pieces.
struct AdamwParams {
  int64_t elements = 0;       // P, with alignment padding
  OwnedTensor values, grads;  // the working dtype (f32 or bf16); grads in its main_grad_dtype
  std::vector<schedules::OptimizerPiece> pieces;
  std::vector<char> initial;  // the weights every run starts from, P elements of `working`
};
// `count` parameters with working weights in `working` (f32 or bf16; another is an Error).
AdamwParams make_adamw_params(Backend& backend, int64_t count, DType working, Stream& stream);
// Copies the initial weights back into p.values (before each run).
void reset_adamw_params(Backend& backend, AdamwParams& p, Stream& stream);

// The pinned copy buffer size the bandwidth measurement uses for `count` parameters (12 bytes
// each, at least 1 MiB, at most 256 MiB).
uint64_t adamw_bandwidth_bytes(int64_t count);
// The backend of runtime.backend (the rank's GPU on CUDA) with an arena that holds `count`
// parameters with working weights in `working` and their gradients, the resident optimizer, the
// largest staging (max_bucket x max_slots) and the bandwidth buffers, and a pinned pool for the
// offloads' host state and copies (the byte functions of ops/schedules); numa node and threads
// from the config (threads > 0 overrides runtime.threads).
BackendOptions adamw_backend_options(const Config& cfg, const RankInfo& ranks, int64_t count,
                                     int64_t max_bucket, int64_t max_slots, int threads,
                                     DType working);
// The host AdamW threads of the serial offload: options.cpu_threads or this rank's cores.
int adamw_host_threads(const BackendOptions& options, const RankInfo& ranks);

// Pinned copy bandwidth in bytes/s, best of 6, over `bytes`: each way alone, and each way while
// the other runs (half the bytes up on `stream` while the other half comes down on a second
// stream: what a schedule that streams both ways at once can get per direction; on a GPU's
// PCIe or C2C link it is below the one-way figure).
struct LinkBandwidth {
  double h2d = 0, d2h = 0;  // one way alone
  double both_ways = 0;     // per direction, both at once (the slower of the two)
};
LinkBandwidth pinned_bandwidth(Backend& backend, uint64_t bytes, Stream& stream);

// The optimizer of `config.placement` over p (its bucket_params and staging_slots for
// offload_stream).
std::unique_ptr<schedules::Optimizer> make_adamw(Backend& backend, AdamwParams& p,
                                                 const OptimizerConfig& config, int host_threads);

struct AdamwRun {
  std::vector<double> times;         // the timed steps (step() to the stream idle), seconds
  MemoryStats peaks;                 // device peaks over all steps
  std::vector<float> weights, m, v;  // after the last step (bf16 weights widened)
  std::vector<float> master;         // the fp32 master of bf16 weights (empty for f32 weights)
};
// warmup + iters steps of `optimizer` (gradients as in p), peaks reset first.
AdamwRun time_adamw(Backend& backend, AdamwParams& p, schedules::Optimizer& optimizer, int warmup,
                    int iters, Stream& stream);

// max |a - b| / |b| over elements that differ bitwise (0 when all are bitwise equal).
double float_max_rel_err(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace moepeak::measure
