// PipelinedLLEP's launch shape and byte functions (see dispatch_pipelined_llep.h, "Bound"): the
// chunking, the slots S, the tile rows T and the F blocks, and the exact `dispatch` footprints the
// dispatcher (dispatch_pipelined_llep.cpp) allocates — the planner's and the tests' numbers. The
// experts' biases and activation add no dispatch buffer, so nothing here depends on them.
// Test: ctest -R test_llep (measured peaks against these), tests/plan/.
#include <algorithm>

#include "core/error.h"
#include "core/runtime/arena.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/schedule_dtype.h"

namespace moepeak::schedules {

namespace {

uint64_t fp(uint64_t bytes) { return DeviceArena::footprint(bytes); }

// The narrowest F block the shape rule picks while a wider one fits: GEMMs with fewer than 64
// columns per block run well below a full expert GEMM's rate.
constexpr uint64_t kMinFfnBlock = 64;

// One chunk's sizes, unsigned (from the chunking of pipelined_llep_shape).
// b: the storage dtype's bytes; b_acc: the tile accumulators' (y, dx, dweight summed over F
// blocks: main_grad_dtype, fp32 beside bf16).
struct Sizes {
  uint64_t W, Mc, Rc, ce, H, F, b, b_acc;
};
Sizes sizes_of(const PipelinedLlepShape& s, int64_t hidden, int64_t ffn, DType dtype,
               int64_t world) {
  return {static_cast<uint64_t>(world),
          static_cast<uint64_t>(s.rows_per_source),
          static_cast<uint64_t>(s.receive_rows),
          static_cast<uint64_t>(s.chunk_tokens),
          static_cast<uint64_t>(hidden),
          static_cast<uint64_t>(ffn),
          dtype_size(dtype),
          dtype_size(main_grad_dtype(dtype))};
}

// The footprints the dispatcher allocates with S slots, T-row tiles and F blocks of Fb columns,
// split into rows (buffers with H or F columns: what the bound 2 W M_c H b is about) and
// metadata. run_forward and run_backward allocate exactly these (the tests compare the measured
// peak with them).
struct Footprints {
  uint64_t rows_forward, meta_forward, rows_backward, meta_backward;
};
Footprints footprints(const Sizes& z, uint64_t S, uint64_t T, uint64_t Fb) {
  const uint64_t row_M = fp(z.Mc * z.H * z.b), row_R = fp(z.Rc * z.H * z.b);
  const uint64_t tile_H = fp(T * z.H * z.b), tile_F = fp(T * Fb * z.b);
  const uint64_t tile_acc = fp(T * z.H * z.b_acc);    // y (forward) or dx (backward) over F blocks
  const uint64_t staging = (S >= 2 ? 2 : 1) * row_M;  // sent rows [, returned rows if S >= 2]
  const uint64_t send_index = 2 * fp(z.Mc * 4);       // per slot: send token, slot (i32)
  Footprints f;
  // Slots; x and y tiles; a, b, g blocks.
  f.rows_forward = staging + S * row_R + tile_H + tile_acc + 3 * tile_F;
  f.meta_forward = S * (send_index + fp(z.Mc * z.b));  // + the routing weights
  // Slots of x and dout rows; x, dout and dx tiles; a, b, g, dg blocks.
  f.rows_backward = staging + 2 * S * row_R + 2 * tile_H + tile_acc + 4 * tile_F;
  // Weights sent [, dweights returned if S >= 2]; per slot the indices and the received
  // weights (then dweights); a tile's weights and dweights.
  f.meta_backward = (S >= 2 ? 2 : 1) * fp(z.Mc * z.b) + S * (send_index + fp(z.Rc * z.b)) +
                    fp(T * z.b) + fp(T * z.b_acc);
  return f;
}

// Forward and backward footprints of the whole shape (zero when there is no chunk).
Footprints footprints_of(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn, DType dtype,
                         int64_t world, const PipelinedLlepParams& params) {
  const PipelinedLlepShape s =
      pipelined_llep_shape(tokens, top_k, hidden, ffn, dtype, world, params);
  if (s.chunks == 0) return {};
  return footprints(sizes_of(s, hidden, ffn, dtype, world), static_cast<uint64_t>(s.slots),
                    static_cast<uint64_t>(s.tile_rows), static_cast<uint64_t>(s.ffn_block));
}

}  // namespace

PipelinedLlepParams pipelined_llep_params(const SchedulesConfig& schedules) {
  PipelinedLlepParams q;
  q.chunk_tokens = schedules.chunk_tokens;
  q.max_chunks = schedules.max_chunks;
  q.membership = schedules.chunk_membership;
  q.lambda = schedules.llep_lambda;
  q.alpha = schedules.llep_alpha;
  q.min_tokens_per_gemm = schedules.min_tokens_per_gemm;
  q.slots = schedules.llep_slots;
  q.max_helped_experts = schedules.llep_max_helped_experts;
  return q;
}

PipelinedLlepShape pipelined_llep_shape(int64_t tokens, int64_t top_k, int64_t world,
                                        const PipelinedLlepParams& params) {
  MOEPEAK_CHECK(tokens >= 0 && top_k >= 0 && world >= 1, "pipelined llep shape: ", tokens,
                " tokens, top-", top_k, ", ", world, " ranks");
  MOEPEAK_CHECK(params.chunk_tokens >= 1 && params.max_chunks >= 1,
                "pipelined llep: chunk_tokens = ", params.chunk_tokens,
                " and max_chunks = ", params.max_chunks, " must be >= 1");
  PipelinedLlepShape s;
  if (tokens == 0) return s;
  s.chunks = std::min((tokens + params.chunk_tokens - 1) / params.chunk_tokens, params.max_chunks);
  s.chunk_tokens = (tokens + s.chunks - 1) / s.chunks;
  s.rows_per_source = top_k * s.chunk_tokens;
  s.receive_rows = llep_receive_capacity(s.rows_per_source, world, params.llep());
  return s;
}

PipelinedLlepShape pipelined_llep_shape(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                        DType dtype, int64_t world,
                                        const PipelinedLlepParams& params) {
  MOEPEAK_CHECK(hidden >= 0 && ffn >= 0, "pipelined llep shape: H = ", hidden, ", F = ", ffn);
  PipelinedLlepShape s = pipelined_llep_shape(tokens, top_k, world, params);
  if (s.chunks == 0) return s;
  const Sizes z = sizes_of(s, hidden, ffn, dtype, world);
  const uint64_t budget = 2 * z.W * z.Mc * z.H * z.b;  // 2 Ep k c_eff H b
  // Whether the rows of forward and of backward both stay within `limit`.
  auto within = [&](uint64_t limit, uint64_t S, uint64_t T, uint64_t Fb) {
    const Footprints f = footprints(z, S, T, Fb);
    return f.rows_forward <= limit && f.rows_backward <= limit;
  };
  auto fits = [&](uint64_t S, uint64_t T, uint64_t Fb) { return within(budget, S, T, Fb); };
  // The largest v in [lo, hi] with ok(v), given ok(lo) (the footprints grow with T and Fb).
  auto largest = [](uint64_t lo, uint64_t hi, auto ok) {
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (ok(mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  const uint64_t t_min = std::min<uint64_t>(
      z.ce, static_cast<uint64_t>(std::max<int64_t>(1, params.min_tokens_per_gemm)));
  const uint64_t f_min = std::min<uint64_t>(z.F, kMinFfnBlock);
  MOEPEAK_CHECK(params.slots >= 0 && params.slots <= kPipelinedLlepMaxSlots,
                "pipelined llep: schedules.llep_slots = ", params.slots, " must be in [0, ",
                kPipelinedLlepMaxSlots, "]");
  uint64_t S = 1, T = t_min, Fb = std::max<uint64_t>(f_min, 1);
  if (params.slots > 0) {
    // Asked for: bounded if its slots fit with tiles worth overlapping (T_min rows, F_min
    // columns) — or, one slot, any tile; else the T_min, F_min tiles beside them, over the bound.
    S = static_cast<uint64_t>(params.slots);
    s.bounded = S >= 2 ? fits(S, t_min, f_min) : fits(1, 1, 1);
  } else if (fits(2, t_min, f_min)) {
    S = 2;
  } else if (!fits(1, 1, 1)) {
    s.bounded = false;  // the corner case of the header's "Bound": over by the rows
  }
  // F in equal blocks of at most `widest` >= 1 columns: ceil(F / ceil(F / widest)) each, which
  // still fit (no wider than `widest`).
  auto equal_blocks = [&](uint64_t widest) -> uint64_t {
    if (z.F == 0) return 0;
    const uint64_t blocks = (z.F + widest - 1) / widest;
    return (z.F + blocks - 1) / blocks;
  };
  // NOTES: the per-call costs of an expert tile's GEMMs on top of their flops are a packing of
  // the weights' block (Fb H, once per tile and block) and of the tile's rows (T H, once per
  // block) — on a GPU a launch per GEMM besides — so the overhead per flop goes as 1/T + 1/Fb:
  // among the (T, widest Fb) pairs that `ok` allows, take the one that minimizes it (T on a
  // geometric grid down to t_lo; ties to the larger T). ok(t_lo, f_lo) holds.
  auto cheapest = [&](auto ok, uint64_t t_lo, uint64_t f_lo) {
    const uint64_t t_hi = largest(t_lo, z.ce, [&](uint64_t t) { return ok(t, f_lo); });
    double best = 0;
    for (uint64_t t = t_hi;;) {
      const uint64_t widest = largest(f_lo, z.F, [&](uint64_t v) { return ok(t, v); });
      const uint64_t f = std::max<uint64_t>(1, equal_blocks(widest));
      const double cost = 1.0 / static_cast<double>(t) + 1.0 / static_cast<double>(f);
      if (t == t_hi || cost < best) {
        best = cost;
        T = t;
        Fb = f;
      }
      if (t <= t_lo) break;
      t = std::max(t_lo, std::min(t - 1, t * 15 / 16));
    }
  };
  if (s.bounded) {
    const uint64_t f_lo = fits(S, 1, f_min) ? f_min : 1;
    auto ok = [&](uint64_t t, uint64_t f) { return fits(S, t, f); };
    const uint64_t t_lo =
        S >= 2 ? std::min(t_min, largest(1, z.ce, [&](uint64_t t) { return ok(t, f_lo); })) : 1;
    cheapest(ok, t_lo, f_lo);
  } else {
    // Over the bound whatever the tiles: T_min-row tiles and F_min-column blocks overshoot it
    // least, but tiles that small cost a GPU a launch per 32 x 64 block (the small preset on one
    // H200: 2.7 s a step against 0.11 s for the standard dispatch, docs/perf.md). Tiles may use
    // one more U = M_c H b beside that least overshoot: the cheapest pair within it.
    const uint64_t least = footprints(z, S, t_min, f_min).rows_backward;
    const uint64_t allowed = least + z.Mc * z.H * z.b;
    cheapest([&](uint64_t t, uint64_t f) { return within(allowed, S, t, f); }, t_min, f_min);
  }
  s.slots = static_cast<int64_t>(S);
  s.tile_rows = static_cast<int64_t>(T);
  // The dispatcher's loop runs blocks [f0, min(F, f0 + Fb)) for f0 = 0, Fb, 2 Fb, ...
  s.ffn_blocks = static_cast<int64_t>(std::max<uint64_t>(1, (z.F + Fb - 1) / Fb));
  s.ffn_block = static_cast<int64_t>(Fb);
  return s;
}

uint64_t pipelined_llep_forward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                      DType dtype, int64_t world,
                                      const PipelinedLlepParams& params) {
  const Footprints f = footprints_of(tokens, top_k, hidden, ffn, dtype, world, params);
  return f.rows_forward + f.meta_forward;
}

uint64_t pipelined_llep_backward_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params) {
  const Footprints f = footprints_of(tokens, top_k, hidden, ffn, dtype, world, params);
  return f.rows_backward + f.meta_backward;
}

uint64_t pipelined_llep_dispatch_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                       DType dtype, int64_t world,
                                       const PipelinedLlepParams& params) {
  return std::max(pipelined_llep_forward_bytes(tokens, top_k, hidden, ffn, dtype, world, params),
                  pipelined_llep_backward_bytes(tokens, top_k, hidden, ffn, dtype, world, params));
}

uint64_t pipelined_llep_bound_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t ffn,
                                    DType dtype, int64_t world, const PipelinedLlepParams& params) {
  const PipelinedLlepShape s =
      pipelined_llep_shape(tokens, top_k, hidden, ffn, dtype, world, params);
  if (s.chunks == 0) return 0;
  const Footprints f = footprints_of(tokens, top_k, hidden, ffn, dtype, world, params);
  return 2 * static_cast<uint64_t>(world) * static_cast<uint64_t>(s.rows_per_source) *
             static_cast<uint64_t>(hidden) * dtype_size(dtype) +
         std::max(f.meta_forward, f.meta_backward);
}

}  // namespace moepeak::schedules
