// One MoE layer's expert dispatch on this rank, measured for any dispatch schedule: the harness
// `moepeak bench dispatch` (every schedule side by side) and `moepeak tune`'s dispatch sweep
// (PipelinedLLEP over (c, K_max)) share.
//
//   DispatchLayer layer(backend, comm, {N, H, F, E, k, DType::f32, "zipf", 1.2, 1});  // collective
//   schedules::PipelinedLlepDispatch d(backend, stream, comm, DType::f32, E, params);
//   DispatchRun r = layer.run(d, warmup, iters);   // r.times, r.stats (peak of every live set)
//
// Inputs (all seeded, so every schedule and every run sees the same layer): x, dout (N, H)
// uniform in +-1; routing index / weight (N, k) by measure::seeded_routing; this rank's E/W
// experts by measure::seeded_local_experts (the same weights on any W). Each repetition zeroes
// out, dx and the expert gradients, starts together on every rank (a barrier), and runs forward
// + backward (with Recompute: forward, release, the checkpoint recompute's forward, backward).
// Times are this rank's; take measure::max_over_ranks for the job's. Test: ctest -R test_measure
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/memory_stats.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/dispatch.h"

namespace moepeak::measure {

struct DispatchLayerShape {
  int64_t tokens = 0;  // N per rank
  int64_t hidden = 0, ffn = 0, experts = 0, top_k = 0;
  DType dtype = DType::f32;      // f32 or f64 (bf16 on the CUDA backend)
  std::string routing = "zipf";  // seeded_routing's kinds
  double zipf_s = 1.2;
  int64_t segments = 1;
};

// What a layer under gradient checkpointing also runs between forward and backward.
enum class Recompute {
  off,        // forward + backward
  output,     // the recompute's forward into a tensor of its own (its output dropped)
  plan_only,  // the recompute's forward with no output (PipelinedLLEP only plans there)
};

struct DispatchRun {
  std::vector<double> times;  // the timed repetitions, this rank's seconds
  MemoryStats stats;          // the arena over every repetition (warm-up included)
  // With read_results: out, dx (N, H), dweight (N, k), and this rank's expert weight gradients
  // (dw1, dw3, dw2 per local expert, concatenated), as doubles.
  std::vector<double> out, dx, dweight, dw;
};

class DispatchLayer {
 public:
  // Collective only in that every rank builds its own layer. Error when E % W != 0 or k > E, or
  // bf16 off the CUDA backend.
  DispatchLayer(Backend& backend, Comm& comm, const DispatchLayerShape& shape);

  const DispatchLayerShape& shape() const { return shape_; }

  // `warmup` untimed then `iters` timed repetitions of `d`; the arena's peaks are reset first
  // (after the recompute's output tensor is made, at the first Recompute::output run).
  DispatchRun run(schedules::ExpertDispatch& d, int warmup, int iters,
                  Recompute recompute = Recompute::off, bool read_results = false);

 private:
  OwnedTensor tensor(Shape shape, const char* what);
  std::vector<double> read(const Tensor& t);

  Backend& backend_;
  Comm& comm_;
  DispatchLayerShape shape_;
  OwnedTensor x_, dout_, out_, dx_, weight_, dweight_, index_, recompute_out_;
  std::vector<OwnedTensor> storage_;
  std::vector<schedules::ExpertWeights> experts_;
};

}  // namespace moepeak::measure
