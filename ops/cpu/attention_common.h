// The parts the CPU attention kernels share (ops/cpu/attention_forward.cpp, attention_backward.cpp,
// attention_rows.cpp): the problem's geometry and block plan, the GEMM wrappers, the row kernels
// (max, exp with its sum, dS), the per-thread scratch, the copies between the tensors' storage and
// the fp32/f64 scratch, and which keys a query block visits and each of its rows sees (the causal
// mask, the sliding window and the documents). Semantics: ops/attention.h.
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    lse: (B, nh, T)
//   out, dout: (B, T, nh, dv)  v, dv: (B, T, nkv, dv)    doc_start: (B, T) i32
//
// A query block is batch b, kv head g and positions [t0, t0 + P): it stacks the G = nh / nkv query
// heads of g, row r = (t - t0) * G + hh for query head g * G + hh. Keys are cut into key blocks
// of plan.keys from 0; a query block visits those from the one holding its first row's first key,
// max(0, t0 - W + 1) with a window W (0 without), raised to doc_start[b][t0] with documents, to
// the one holding its last position (cut there), and each row sees the keys of its own window
// and document (visible_span). Without a window or documents this is the causal loop as it always
// was.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/parallel_ranges.h"
#include "ops/cpu/simd_exp.h"

namespace moepeak::ops::attention_cpu {

// ---- Problem geometry and block plan ------------------------------------------------------------

struct Geometry {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0;
  int64_t qk_dim = 0;  // dqk: the width of q, k, dq, dk
  int64_t v_dim = 0;   // dv: the width of v, out, dout, dv
  int64_t group() const { return heads / kv_heads; }
  // Offset of element 0 of row (b, t, head) in a (B, T, heads_in_tensor, dim) tensor.
  int64_t offset(int64_t b, int64_t t, int64_t head, int64_t heads_in_tensor, int64_t dim) const {
    return ((b * seq + t) * heads_in_tensor + head) * dim;
  }
};

// The geometry of checked arguments: q (B, T, nh, dqk), k (B, T, nkv, dqk), v (B, T, nkv, dv).
inline Geometry geometry_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return Geometry{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

struct BlockPlan {
  int64_t group = 1;      // query heads per kv head (G)
  int64_t positions = 1;  // positions per query block (P)
  int64_t rows = 1;       // rows of a full query block, P * G
  int64_t keys = 1;       // keys per key block
  int64_t window = 0;     // W <= T: row t sees keys t - W < s <= t; 0: every s <= t
  // doc_start (B, T) of the call, seq = T apart, or nullptr (one document per sequence): row t of
  // sequence b sees keys s >= doc_start[b * seq + t].
  const int32_t* doc_start = nullptr;
  int64_t seq = 0;
};

// NOTES: a window W >= T sees every key s <= t, as W = T does; the plan keeps min(W, T), so the
// window arithmetic (t - W + 1) cannot overflow for any W the caller passes.
inline BlockPlan plan_blocks(const Geometry& geo, AttentionBlocks blocks, int64_t window,
                             const int32_t* doc_start) {
  BlockPlan plan;
  plan.group = geo.group();
  plan.positions = std::max<int64_t>(1, blocks.query_rows / plan.group);
  plan.rows = plan.positions * plan.group;
  plan.keys = blocks.keys;
  plan.window = std::min(window, geo.seq);
  plan.doc_start = doc_start;
  plan.seq = geo.seq;
  return plan;
}

inline void check_blocks(const char* op, AttentionBlocks blocks) {
  if (blocks.query_rows < 1 || blocks.keys < 1)
    MOEPEAK_THROW(op, ": block sizes must be positive, got ", blocks.query_rows, " query rows x ",
                  blocks.keys, " keys");
}

// Adds n to the count of score entries computed (detail::attention_cpu_scores_computed).
void count_scores(int64_t n);

// Throws moepeak::Error naming `op` unless doc_start (B, T) keeps its contract (ops/attention.h):
// 0 <= doc_start[b][t] <= t and non-decreasing in t. The kernels run it before anything else, so
// a broken value cannot make them read before a tensor (a negative start) or normalise a row that
// sees no key (a start after t).
void check_document_starts(const char* op, const Geometry& geo, const int32_t* doc_start);

// ---- GEMM (row-major CBLAS) ---------------------------------------------------------------------

inline void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

inline void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
                 double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// ---- Row kernels: max, exp(x - shift) with its sum, dS = P * (dP - D) ---------------------------
// Generic versions (f64, and f32 without AVX2) use std::exp. The f32 AVX2 versions
// (ops/cpu/attention_rows.cpp) use ops/cpu/simd_exp.h's exp_avx2 (within 1.5 ulp) so the
// exponentials, about one per 4d GEMM FLOPs, do not dominate. Arguments below -87.3 give exactly 0.

template <typename T>
T row_max_generic(const T* x, int64_t n) {
  T best = x[0];
  for (int64_t i = 1; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

template <typename T>
T exp_shift_sum_generic(T* x, int64_t n, T shift) {
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

template <typename T>
void dscores_generic(T* p_to_ds, const T* dp, int64_t n, T d_row) {
  for (int64_t i = 0; i < n; ++i) p_to_ds[i] *= dp[i] - d_row;
}

using ops::cpu_has_avx2_fma;  // ops/cpu/simd_exp.h

#if defined(__x86_64__)
float row_max_avx2(const float* x, int64_t n);
float exp_shift_sum_avx2(float* x, int64_t n, float shift);
void dscores_avx2(float* p_to_ds, const float* dp, int64_t n, float d_row);
void widen_bf16_avx2(const bf16* src, float* dst, int64_t n);
#endif

template <typename T>
T row_max(const T* x, int64_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2_fma()) return row_max_avx2(x, n);
  }
#endif
  return row_max_generic(x, n);
}

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the new values.
template <typename T>
T exp_shift_sum(T* x, int64_t n, T shift) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2_fma()) return exp_shift_sum_avx2(x, n, shift);
  }
#endif
  return exp_shift_sum_generic(x, n, shift);
}

// p_to_ds[i] = p_to_ds[i] * (dp[i] - d_row): turns a row of P into a row of dS.
template <typename T>
void dscores(T* p_to_ds, const T* dp, int64_t n, T d_row) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2_fma()) return dscores_avx2(p_to_ds, dp, n, d_row);
  }
#endif
  dscores_generic(p_to_ds, dp, n, d_row);
}

// ---- Scratch: one query block and one score block per worker thread ----------------------------
// T is the compute type (float for f32 and bf16 storage, double for f64). f32 and f64 read the
// key/value blocks in place and sum dK, dV straight into dk, dv; bf16 storage widens each
// key/value block into k_block / v_block and sums one key block's dK, dV in dk_block / dv_block.

template <typename T>
struct Scratch {
  std::vector<T> q_rows;       // rows x dqk: the block's queries
  std::vector<T> dout_rows;    // rows x dv: the block's output gradients (backward)
  std::vector<T> accumulator;  // rows x dv: P V (forward), or rows x dqk: dQ (backward)
  std::vector<T> scores;       // rows x keys: S, then P, then dS
  std::vector<T> dprobs;       // rows x keys: dP (backward)
  std::vector<T> row_max;      // rows: running max m (forward)
  std::vector<T> row_sum;      // rows: running sum l (forward) / lse (backward)
  std::vector<T> row_delta;    // rows: D = rowsum(dout * out) (backward)
  std::vector<T> k_block;      // keys x dqk: a widened key block (bf16 storage)
  std::vector<T> v_block;      // keys x dv: a widened value block (bf16 storage)
  std::vector<T> dk_block;     // keys x dqk: dK of one key block (bf16 backward)
  std::vector<T> dv_block;     // keys x dv: dV of one key block (bf16 backward)

  void reserve(const BlockPlan& plan, const Geometry& geo, bool backward, bool widened) {
    const size_t rows = static_cast<size_t>(plan.rows), keys = static_cast<size_t>(plan.keys);
    const size_t qk_dim = static_cast<size_t>(geo.qk_dim), v_dim = static_cast<size_t>(geo.v_dim);
    const size_t score_block = rows * keys;
    q_rows.resize(rows * qk_dim);
    accumulator.resize(rows * (backward ? qk_dim : v_dim));
    scores.resize(score_block);
    row_sum.resize(rows);
    if (backward) {
      dout_rows.resize(rows * v_dim);
      dprobs.resize(score_block);
      row_delta.resize(rows);
    } else {
      row_max.resize(rows);
    }
    if (widened) {
      k_block.resize(keys * qk_dim);
      v_block.resize(keys * v_dim);
      if (backward) {
        dk_block.resize(keys * qk_dim);
        dv_block.resize(keys * v_dim);
      }
    }
  }
};

template <typename T>
Scratch<T>& thread_scratch() {
  thread_local Scratch<T> scratch;
  return scratch;
}

// One query block: batch b, kv head g, positions [t0, t0 + positions).
struct QueryBlock {
  int64_t b = 0, kv_head = 0, t0 = 0, positions = 0;
  int64_t rows(const BlockPlan& plan) const { return positions * plan.group; }
  int64_t last_position() const { return t0 + positions - 1; }
};

// ---- Storage: blocks between the tensors (storage type S) and the scratch (compute_t<S>) -------
// f32 and f64 copy rows (or read key/value blocks in place); bf16 widens on the way in and rounds
// each element once on the way out (ops/cpu/cpu_storage.h).

template <typename S>
constexpr bool kWidened = !std::is_same_v<S, compute_t<S>>;

// widen() with the AVX2 loop where the CPU has it (the block copies are ~20% of a bf16 backward
// with the scalar loop).
inline void widen_run(const bf16* src, float* dst, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return widen_bf16_avx2(src, dst, n);
#endif
  widen(src, dst, n);
}

// Copies rows of a (B, T, nh, dim) tensor into / out of a block's stacked rows (dim apart).
template <typename S>
void gather_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk, int64_t dim,
                 const S* src, compute_t<S>* rows) {
  const int64_t run = plan.group * dim;
  for (int64_t p = 0; p < blk.positions; ++p) {
    const S* from = src + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group, geo.heads, dim);
    if constexpr (kWidened<S>) {
      widen_run(from, rows + p * run, run);
    } else {
      std::memcpy(rows + p * run, from, static_cast<size_t>(run) * sizeof(S));
    }
  }
}

template <typename S>
void scatter_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk, int64_t dim,
                  const compute_t<S>* rows, S* dst) {
  const int64_t run = plan.group * dim;
  for (int64_t p = 0; p < blk.positions; ++p) {
    S* to = dst + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group, geo.heads, dim);
    if constexpr (kWidened<S>) {
      narrow(rows + p * run, to, run);
    } else {
      std::memcpy(to, rows + p * run, static_cast<size_t>(run) * sizeof(S));
    }
  }
}

// A key or value block as a GEMM operand: `keys` rows of dim (dqk or dv), `ld` apart.
template <typename T>
struct KvOperand {
  const T* data;
  int64_t ld;
};

// Rows [s0, s0 + keys) of one kv head of a (B, T, nkv, d) tensor, d = dqk (k) or dv (v) (element
// `offset` is row s0): in place for f32 and f64 (rows nkv * d apart), widened into `scratch` for
// bf16 (rows d apart), once per block visit.
template <typename S>
KvOperand<compute_t<S>> kv_operand(const Geometry& geo, int64_t d, const S* src, int64_t offset,
                                   int64_t keys, compute_t<S>* scratch) {
  const int64_t kv_stride = geo.kv_heads * d;
  if constexpr (kWidened<S>) {
    for (int64_t j = 0; j < keys; ++j) widen_run(src + offset + j * kv_stride, scratch + j * d, d);
    return {scratch, d};
  } else {
    (void)keys, (void)scratch;
    return {src + offset, kv_stride};
  }
}

// Index of row r's entry in lse (B, nh, T).
inline int64_t lse_index(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk,
                         int64_t r) {
  int64_t head = blk.kv_head * plan.group + r % plan.group;
  return (blk.b * geo.heads + head) * geo.seq + blk.t0 + r / plan.group;
}

// ---- Which keys a block visits and a row sees ---------------------------------------------------

// The first key position t of sequence b sees: max(0, t - W + 1) with a window (0 without),
// raised to the first position of its document with documents.
inline int64_t first_visible_key(const BlockPlan& plan, int64_t b, int64_t t) {
  int64_t first = plan.window > 0 ? std::max<int64_t>(0, t - plan.window + 1) : 0;
  if (plan.doc_start != nullptr) first = std::max<int64_t>(first, plan.doc_start[b * plan.seq + t]);
  return first;
}

// The first key block the query block visits: the one holding its first row's first key (no
// later row sees an earlier key: t - W + 1 and doc_start both grow with t). Key blocks are
// [s0, s0 + plan.keys) with s0 a multiple of plan.keys, whatever the window or documents: the
// bf16 backward's second pass (by key blocks) repeats the one-pass loop's products only if both
// cut the keys alike, as OpenBLAS's value for an element depends on the other rows and columns
// of its call (its kernels' tails).
inline int64_t first_key_block(const BlockPlan& plan, const QueryBlock& blk) {
  return first_visible_key(plan, blk.b, blk.t0) / plan.keys * plan.keys;
}

// Calls f(s0, keys) for the key blocks [s0, s0 + keys) the query block visits, in order: from
// first_key_block to the one holding its last position, cut there. Key blocks wholly before
// every row's window and document are never visited, so a windowed call costs
// O(T * (W + P + keys)), not O(T^2), and one with documents of lengths L_i about
// sum_i L_i^2 + T * (P + keys). NOTES: every visited key block holds a key some row of the block
// sees: row t sees [first_visible_key(t), t], first_visible_key(t) <= t grows with t, so the
// spans of rows t and t + 1 meet and the block's rows together see all of
// [first_visible_key(t0), last position]. No visited (query block, key block) pair is wholly
// masked.
template <typename F>
void for_each_key_block(const BlockPlan& plan, const QueryBlock& blk, F&& f) {
  for (int64_t s0 = first_key_block(plan, blk); s0 <= blk.last_position(); s0 += plan.keys)
    f(s0, std::min(plan.keys, blk.last_position() + 1 - s0));
}

// Whether some row of the block masks some key of [s0, s0 + keys): the diagonal (keys after the
// first row's position) or the lower edge of the last row's window or document (the highest of
// the block's rows; without a window or documents it is 0, which masks nothing).
inline bool block_needs_mask(const BlockPlan& plan, const QueryBlock& blk, int64_t s0,
                             int64_t keys) {
  return s0 + keys - 1 > blk.t0 || first_visible_key(plan, blk.b, blk.last_position()) > s0;
}

// The keys of [s0, s0 + keys) that row r sees: [begin, end) with 0 <= begin <= end <= keys.
struct KeySpan {
  int64_t begin = 0, end = 0;
};
inline KeySpan visible_span(const BlockPlan& plan, const QueryBlock& blk, int64_t r, int64_t s0,
                            int64_t keys) {
  const int64_t position = blk.t0 + r / plan.group;
  KeySpan span;
  span.end = std::clamp<int64_t>(position - s0 + 1, 0, keys);
  span.begin = std::clamp<int64_t>(first_visible_key(plan, blk.b, position) - s0, 0, span.end);
  return span;
}

// Row r's span in [s0, s0 + keys) (all of it where the block masks nothing), with the entries
// outside it set to exactly 0 (no -inf arithmetic): masked keys never touch the row's bits.
template <typename T>
KeySpan mask_row(const BlockPlan& plan, const QueryBlock& blk, bool needs_mask, int64_t r,
                 int64_t s0, int64_t keys, T* row) {
  if (!needs_mask) return KeySpan{0, keys};
  const KeySpan span = visible_span(plan, blk, r, s0, keys);
  std::fill(row, row + span.begin, T(0));
  std::fill(row + span.end, row + keys, T(0));
  return span;
}

// Calls f(block) for every query block in the fixed order (b, kv head, t0).
template <typename F>
void for_each_query_block(const Geometry& geo, const BlockPlan& plan, F&& f) {
  for (int64_t b = 0; b < geo.batch; ++b)
    for (int64_t g = 0; g < geo.kv_heads; ++g)
      for (int64_t t0 = 0; t0 < geo.seq; t0 += plan.positions)
        f(QueryBlock{b, g, t0, std::min(plan.positions, geo.seq - t0)});
}

// f(b, g, scratch) for each (batch, kv head) pair, the pairs spread over the rank's compute
// threads (ops/cpu/parallel_ranges.h) with OpenBLAS held to one thread meanwhile (the pairs are
// the parallelism), each thread with its own scratch reserved for (backward, widened). One
// thread runs a pair whole, so what its blocks accumulate (the kv head's dK, dV) sums in the
// serial order; OpenBLAS's results do not depend on its thread count: bitwise one thread's.
template <typename T, typename F>
void for_each_head_pair(const Geometry& geo, const BlockPlan& plan, bool backward, bool widened,
                        F&& f) {
  const int threads = cpu_op_threads();
  const int64_t pairs = geo.batch * geo.kv_heads;
  auto run = [&](int64_t begin, int64_t end) {
    Scratch<T>& s = thread_scratch<T>();
    s.reserve(plan, geo, backward, widened);
    for (int64_t pair = begin; pair < end; ++pair) f(pair / geo.kv_heads, pair % geo.kv_heads, s);
  };
  if (threads == 1 || pairs < 2) {
    run(0, pairs);
    return;
  }
  SingleThreadedBlas one_blas_thread;
  parallel_ranges(pairs, 1, threads, run);
}

// The query blocks of pair (b, g), in for_each_query_block's order.
template <typename F>
void for_each_query_block_of(const Geometry& geo, const BlockPlan& plan, int64_t b, int64_t g,
                             F&& f) {
  for (int64_t t0 = 0; t0 < geo.seq; t0 += plan.positions)
    f(QueryBlock{b, g, t0, std::min(plan.positions, geo.seq - t0)});
}

}  // namespace moepeak::ops::attention_cpu
