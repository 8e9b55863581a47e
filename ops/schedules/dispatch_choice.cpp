// make_dispatch / dispatch_bytes / dispatch_spill_bytes / dispatch_workspace_bytes: the
// `dispatch` live set's one choice point (see dispatch_choice.h). Test: ctest -R
// test_schedule_choice
#include "ops/schedules/dispatch_choice.h"

#include <algorithm>

#include "core/error.h"
#include "core/runtime/arena.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/llep_plan.h"

namespace moepeak::schedules {
namespace {

LlepParams llep_params(const SchedulesConfig& s) {
  return LlepParams{s.llep_alpha, s.llep_lambda, s.min_tokens_per_gemm, s.llep_max_helped_experts};
}

// "3 x " when `layers` layers hold the buffers at once, else nothing.
std::string times(int64_t layers) {
  return layers > 1 ? std::to_string(layers) + " x " : std::string();
}

uint64_t fp(int64_t bytes) { return DeviceArena::footprint(static_cast<uint64_t>(bytes)); }

}  // namespace

DispatchKind dispatch_kind(DispatchSchedule schedule, int world) {
  switch (schedule) {
    case DispatchSchedule::standard:
      return world == 1 ? DispatchKind::standard : DispatchKind::expert_parallel;
    case DispatchSchedule::llep:
      return DispatchKind::llep;
    case DispatchSchedule::pipelined_llep:
      return DispatchKind::pipelined_llep;
  }
  MOEPEAK_THROW("schedules.dispatch: unknown schedule ", static_cast<int>(schedule));
}

std::unique_ptr<ExpertDispatch> make_dispatch(const SchedulesConfig& s, Backend& backend,
                                              Stream& stream, Comm& comm, DType dtype,
                                              int64_t experts,
                                              std::shared_ptr<PipelinedLlepLane>& lane,
                                              const ops::SwigluParams& activation) {
  switch (dispatch_kind(s.dispatch, comm.world_size())) {
    case DispatchKind::standard:
      return std::make_unique<StandardDispatch>(backend, stream, dtype, activation);
    case DispatchKind::expert_parallel:
      return std::make_unique<ExpertParallelDispatch>(backend, stream, comm, dtype, experts,
                                                      activation);
    case DispatchKind::llep:
      return std::make_unique<LlepDispatch>(backend, stream, comm, dtype, experts, llep_params(s),
                                            activation);
    case DispatchKind::pipelined_llep:
      // Collective: every rank makes the lane at the same (first) layer.
      if (!lane) lane = PipelinedLlepLane::make(backend, comm);
      return std::make_unique<PipelinedLlepDispatch>(backend, stream, comm, dtype, experts,
                                                     pipelined_llep_params(s), lane, activation);
  }
  MOEPEAK_THROW("schedules.dispatch: unknown schedule ", static_cast<int>(s.dispatch));
}

ScheduleBytes dispatch_bytes(const SchedulesConfig& s, const DispatchShape& d) {
  const int64_t N = d.tokens, k = d.top_k, H = d.hidden, F = d.ffn, W = d.world;
  const int64_t layers = d.layers_resident;
  const std::string dargs = formula_args({{"N", N}, {"k", k}, {"H", H}, {"F", F}});
  const std::string name(enum_name(s.dispatch));
  switch (dispatch_kind(s.dispatch, d.world)) {
    case DispatchKind::standard:
      return {dispatch_standard_bytes(N, k, H, F, d.dtype, layers),
              "dispatch_standard_bytes(" + dargs + ", layers=" + std::to_string(layers) + ")",
              name};
    case DispatchKind::expert_parallel: {
      // The worst case R = W*N*k (every token to this rank's experts). NOTES: without
      // checkpointing every layer keeps its dispatcher's buffers; the function has no layer
      // count, so the bound is L times it (loose, documented in docs/plan.md).
      const uint64_t one = dispatch_expert_parallel_bytes(N, k, H, F, d.dtype, W * N * k);
      return {static_cast<uint64_t>(layers) * one,
              times(layers) + "dispatch_expert_parallel_bytes(" + dargs +
                  ", R=W*N*k=" + std::to_string(W * N * k) + ")",
              name};
    }
    case DispatchKind::llep: {
      const uint64_t one = llep_dispatch_bytes(N, k, H, F, d.dtype, W, llep_params(s));
      return {static_cast<uint64_t>(layers) * one,
              times(layers) + "llep_dispatch_bytes(" + dargs + ", W=" + std::to_string(W) + ")",
              name};
    }
    case DispatchKind::pipelined_llep: {
      const PipelinedLlepParams pp = pipelined_llep_params(s);
      const PipelinedLlepShape shape = pipelined_llep_shape(N, k, W, pp);
      return {pipelined_llep_dispatch_bytes(N, k, H, F, d.dtype, W, pp),
              "pipelined_llep_dispatch_bytes(" + dargs + ", W=" + std::to_string(W) +
                  ", K=" + std::to_string(shape.chunks) +
                  ", c_eff=" + std::to_string(shape.chunk_tokens) + ")",
              name};
    }
  }
  MOEPEAK_THROW("schedules.dispatch: unknown schedule ", static_cast<int>(s.dispatch));
}

std::optional<DispatchSpillBytes> dispatch_spill_bytes(const SchedulesConfig& s,
                                                       const DispatchShape& d) {
  // A helper's copies of spilled experts in `weights` and, in backward, their gradient buffers
  // plus the owner's returned-gradient scratch in `grads`. LlepDispatch holds its copies from
  // forward to backward (L layers at once under `none`); PipelinedLLEP allocates them inside
  // each forward / backward call (one layer, K chunk plans).
  if (d.world == 1) return std::nullopt;  // one rank: every expert is home
  const int64_t N = d.tokens, k = d.top_k, W = d.world;
  const LlepParams lp = llep_params(s);
  int64_t capacity = 0, plans = 0, layers = 1;
  switch (dispatch_kind(s.dispatch, d.world)) {
    case DispatchKind::standard:
    case DispatchKind::expert_parallel:
      return std::nullopt;
    case DispatchKind::llep:
      capacity = std::max<int64_t>(1, llep_receive_capacity(N * k, d.world, lp));
      plans = 1;
      layers = d.layers_resident;
      break;
    case DispatchKind::pipelined_llep: {
      const PipelinedLlepShape shape = pipelined_llep_shape(N, k, W, pipelined_llep_params(s));
      capacity = std::max<int64_t>(1, shape.receive_rows);
      plans = shape.chunks;
      break;
    }
  }
  const LlepSpillCopyBytes spill = llep_spill_copy_bytes(d.experts, W, d.hidden, d.ffn, d.dtype,
                                                         capacity, plans, lp, d.expert_biases);
  const std::string f = "llep_spill_copy_bytes(" +
                        formula_args({{"E", d.experts},
                                      {"W", W},
                                      {"H", d.hidden},
                                      {"F", d.ffn},
                                      {"cap", capacity},
                                      {"plans", plans}}) +
                        (d.expert_biases ? ", biases" : "") +
                        ", copies=" + std::to_string(spill.copies) + ")";
  DispatchSpillBytes out;
  out.weights = static_cast<uint64_t>(layers) * spill.weights;
  out.grads = static_cast<uint64_t>(layers) * spill.grads + spill.scratch;
  out.weights_function = times(layers) + f + ".weights";
  out.grads_function = times(layers) + f + ".grads + .scratch";
  out.schedule = std::string(enum_name(s.dispatch));
  return out;
}

uint64_t dispatch_workspace_bytes(const SchedulesConfig& s, const DispatchShape& d) {
  const int64_t E = d.experts, W = d.world;
  switch (dispatch_kind(s.dispatch, d.world)) {
    case DispatchKind::standard:
      return 0;
    case DispatchKind::expert_parallel:
      return fp(3 * E * 8);
    case DispatchKind::llep:
      return fp((W + 1) * (E + 1) * 8);
    case DispatchKind::pipelined_llep: {
      // NOTES: the first exchange sends [N, counts padded to K_max chunks] so every rank's
      // message has one length whatever its own chunking; the second (ranks of unequal N only)
      // the counts of K <= K_max chunks, never more.
      const PipelinedLlepParams p = pipelined_llep_params(s);
      return fp((W + 1) * (1 + p.max_chunks * E) * 8);
    }
  }
  MOEPEAK_THROW("schedules.dispatch: unknown schedule ", static_cast<int>(s.dispatch));
}

}  // namespace moepeak::schedules
