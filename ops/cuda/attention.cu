// CUDA attention: causal grouped-query flash attention with an optional sliding window, attention
// sinks and packed documents, forward and backward, SIMT (no tensor cores), f32, bf16 or f64
// storage with math in the storage's compute type (fp32 for f32 and bf16, f64 for f64). The bf16
// calls attention_tc_takes accepts run on the tensor-core kernels of ops/cuda/attention_tc.cu;
// these run the rest. dsinks, for both: ops/cuda/attention_sinks.cu. Semantics as
// ops/cpu/attention.cpp; design: ops/attention.h.
//
//   q, dq: (B, T, nh, dqk)     k, dk: (B, T, nkv, dqk)     v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv)  lse: (B, nh, T)             doc_start: (B, T) i32
//   sinks: (nh) q's dtype      dsinks: (nh) f32 for bf16 q, else q's dtype
//
// dqk, dv <= 256 each. Rows are flattened per kv head g as row = t * G + hh; streamed tiles hold
// 32 entries, one per lane; accumulators are spread over the lanes (column lane + 32 i,
// i < kChunks: dv's chunks in the forward, dqk's in dq, the larger's in dk/dv). Window W > 0: row
// t sees keys t - W < s <= t (a W >= T is plain causal; the host passes 0 for it). Documents
// (doc_start): row t sees keys s >= doc_start[b][t] too (ops/cuda/attention_documents.cuh).
//
//   forward:  block = kBlockRows query rows of (b, g); streams K/V tiles of the keys any row of
//             the block sees (its first row's first key: max(first position - W + 1,
//             doc_start of the first position, 0) .. last position); per row online softmax
//             (running max m, sum l, rescaled accumulator);
//             out = acc / l, lse = m + log l. With sinks the sink's logit s_h is folded in once
//             at the end: m' = max(m, s_h), l' = l exp(m - m') + exp(s_h - m'),
//             out = acc exp(m - m') / l', lse = m' + log l'.
//   dq:       same blocks and stream; D = dout . out per row (computed here: ops allocate
//             nothing), p = exp(scale q.k - lse), ds = p (dout.v - D), dq = scale sum ds k.
//   dk, dv:   block = kBlockRows keys of (b, g); streams tiles of kTile query rows (all heads of
//             the group) from the block's first position to T (or, with a window or documents,
//             to the last position that sees its last key); dv = sum p dout, dk = scale sum ds q.
//             Each key row is owned by one block: written (=), no atomics.
// Tiles outside every row's window and document are skipped by the loop bounds, so a windowed
// call costs O(T W) and one with documents O(sum L_i^2); partly covered tiles are masked per
// element. Every sum runs in a fixed order, so results are bitwise reproducible run to run. Masked
// keys (after t, at or before t - W, or before t's document) get exactly p = 0 (never
// exponentiated). window = 0 without sinks or documents runs exactly the plain causal arithmetic.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_attention.cpp).
#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/attention.h"
#include "ops/cuda/attention_documents.cuh"
#include "ops/cuda/attention_sinks.h"
#include "ops/cuda/attention_tc.h"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;
using cuda::warp_max;
using cuda::warp_sum;

// ---- Kernels ------------------------------------------------------------------------------------

constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;                    // rows (or keys) a warp owns in a block
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // query rows (fwd, dq) or keys (dk/dv)
constexpr int kTile = 32;                          // streamed entries per tile, one per lane
constexpr int kMaxHeadDim = 256;

template <typename T>
struct AttentionArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* dout;
  T* out;             // written by the forward, read by the backward
  compute_t<T>* lse;  // likewise, in the compute dtype (f32 for bf16 storage)
  T* dq;
  T* dk;
  T* dv;
  const T* sinks;            // (nh), or nullptr: no sinks
  int64_t window;            // 0: causal; else 0 < W < T
  const int32_t* doc_start;  // (B, T), or nullptr: one document per sequence
  int64_t seq;               // T
  int heads;                 // nh
  int kv_heads;              // nkv
  int group;                 // G = nh / nkv
  int qk_dim;                // dqk: the width of q, k, dq, dk
  int v_dim;                 // dv: the width of v, out, dout, dv
  double scale;
};

// The first key any row of a block of sequence b starting at flattened row row0 (< T G) sees: its
// first row's (0 without a window or documents; no later row sees an earlier key).
template <typename T>
__device__ __forceinline__ int64_t first_visible_key(const AttentionArgs<T>& a, int64_t b,
                                                     int64_t row0) {
  const int64_t first_pos = row0 / a.group;
  int64_t first = a.window > 0 && first_pos >= a.window ? first_pos - a.window + 1 : 0;
  if (a.doc_start != nullptr) {
    const int64_t doc = cuda::document_start(a.doc_start, b, a.seq, first_pos);
    first = doc > first ? doc : first;
  }
  return first;
}

// The first key position `pos` of sequence b sees (pos - W + 1, or 0 without a window; keys are
// >= 0, so the lower bound then masks nothing and the causal predicate is unchanged), raised to
// its document's first position with documents. pos = -1 (a row past the end) sees nothing
// whatever this returns.
template <typename T>
__device__ __forceinline__ int64_t row_first_key(const AttentionArgs<T>& a, int64_t b,
                                                 int64_t pos) {
  int64_t first = a.window > 0 ? pos - a.window + 1 : 0;
  if (a.doc_start != nullptr && pos >= 0) {
    const int64_t doc = cuda::document_start(a.doc_start, b, a.seq, pos);
    first = doc > first ? doc : first;
  }
  return first;
}

extern __shared__ __align__(16) unsigned char attention_smem[];

// Row stride of a tile read lane-per-row: odd, so a column read by 32 lanes is conflict-free.
__host__ __device__ inline int lane_stride(int d) { return d | 1; }

// Offset of element 0 of (b, t, head) in a (B, T, heads, d) tensor.
__device__ __forceinline__ int64_t row_offset(int64_t b, int64_t t, int64_t head, int64_t seq,
                                              int64_t heads, int64_t d) {
  return ((b * seq + t) * heads + head) * d;
}

// Copies rows [row0, row0 + rows) of the flattened query rows of (b, g) (row = t * G + hh) from a
// (B, T, nh, d) tensor (d = dqk for q, dv for dout) into shared memory with row stride `stride`;
// rows past T * G read 0.
template <typename T, typename C>
__device__ void load_query_rows(const T* src, const AttentionArgs<T>& a, int64_t b, int g,
                                int64_t row0, int rows, int d, int stride, C* dst) {
  const int64_t rows_total = a.seq * a.group;
  for (int i = threadIdx.x; i < rows * d; i += kBlockThreads) {
    const int r = i / d, c = i - r * d;
    const int64_t row = row0 + r;
    C value = C(0);
    if (row < rows_total) {
      const int64_t t = row / a.group;
      const int hh = static_cast<int>(row - t * a.group);
      value = load_as<C>(src, row_offset(b, t, int64_t(g) * a.group + hh, a.seq, a.heads, d) + c);
    }
    dst[r * stride + c] = value;
  }
}

// Copies keys [s0, s0 + n) of kv head g from a (B, T, nkv, d) tensor (d = dqk for k, dv for v),
// row stride `stride`; keys past T read 0.
template <typename T, typename C>
__device__ void load_key_rows(const T* src, const AttentionArgs<T>& a, int64_t b, int g, int64_t s0,
                              int n, int d, int stride, C* dst) {
  for (int i = threadIdx.x; i < n * d; i += kBlockThreads) {
    const int s = i / d, c = i - s * d;
    const int64_t key = s0 + s;
    dst[s * stride + c] =
        key < a.seq ? load_as<C>(src, row_offset(b, key, g, a.seq, a.kv_heads, d) + c) : C(0);
  }
}

// acc[r][i] += sum over the tile's `keys` entries s of w_rows[r * kTile + s] * tile[s * stride + c]
// with c = lane + 32 i < d: the P V of the forward (d = dv) and the dS K of the dq kernel
// (d = dqk), for a warp's kRowsPerWarp rows (their weights in shared memory, one row of kTile per
// query row).
template <typename C, int kChunks>
__device__ __forceinline__ void accumulate_tile(C (&acc)[kRowsPerWarp][kChunks], const C* w_rows,
                                                const C* tile, int stride, int keys, int d,
                                                int lane) {
  for (int s = 0; s < keys; ++s) {
    C w[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) w[r] = w_rows[r * kTile + s];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c < d) {
        const C x = tile[s * stride + c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[r][i] += w[r] * x;
      }
    }
  }
}

// Index in lse (B, nh, T) of flattened row `row` of (b, g).
__device__ __forceinline__ int64_t lse_index(int64_t b, int g, int64_t row, int group, int heads,
                                             int64_t seq) {
  const int64_t t = row / group;
  const int64_t hh = row - t * group;
  return (b * heads + int64_t(g) * group + hh) * seq + t;
}

// Forward. Grid (ceil(T G / kBlockRows), nkv, B); the blocks of the last rows (the most keys)
// are scheduled first. Shared: Q rows (kBlockRows x dqk), K tile (kTile x (dqk | 1)), V tile
// (kTile x dv), probabilities (kBlockRows x kTile). kChunks covers dv (the accumulator).
template <typename T, int kChunks>
__global__ void __launch_bounds__(kBlockThreads)
    attention_forward_kernel(const AttentionArgs<T> a) {
  using C = compute_t<T>;
  const int dqk = a.qk_dim, dv = a.v_dim, ks = lane_stride(dqk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const C scale = static_cast<C>(a.scale);

  C* q_s = reinterpret_cast<C*>(attention_smem);
  C* k_s = q_s + kBlockRows * dqk;
  C* v_s = k_s + kTile * ks;
  C* p_s = v_s + kTile * dv;

  load_query_rows(a.q, a, b, g, row0, kBlockRows, dqk, dqk, q_s);

  int64_t pos[kRowsPerWarp];  // position of each row of the warp, -1 past the last row
  int64_t lo[kRowsPerWarp];   // the first key each row sees
  C m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    pos[r] = row < rows_total ? row / a.group : -1;
    lo[r] = row_first_key(a, b, pos[r]);
    m[r] = C(-INFINITY);
    l[r] = C(0);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) acc[r][i] = C(0);
  }
  const int64_t last_row = (row0 + kBlockRows < rows_total ? row0 + kBlockRows : rows_total) - 1;
  const int64_t last_pos = last_row / a.group;

  for (int64_t s0 = first_visible_key(a, b, row0); s0 <= last_pos; s0 += kTile) {
    const int keys = static_cast<int>(last_pos + 1 - s0 < kTile ? last_pos + 1 - s0 : kTile);
    __syncthreads();  // the previous tile is consumed (and, the first time, Q is loaded)
    load_key_rows(a.k, a, b, g, s0, keys, dqk, ks, k_s);
    load_key_rows(a.v, a, b, g, s0, keys, dv, dv, v_s);
    __syncthreads();

    // Scores of this lane's key against the warp's rows.
    const int64_t key = s0 + lane;
    C score[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) score[r] = C(0);
    if (lane < keys) {
      const C* k_row = k_s + lane * ks;
      const C* q_rows = q_s + warp * kRowsPerWarp * dqk;
      for (int c = 0; c < dqk; ++c) {
        const C kc = k_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) score[r] += q_rows[r * dqk + c] * kc;
      }
    }

    // Online softmax update, row by row (uniform across the warp).
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool visible = lane < keys && key <= pos[r] && key >= lo[r];
      const C s = visible ? score[r] * scale : C(-INFINITY);
      const C tile_max = warp_max(s);
      const C m_new = tile_max > m[r] ? tile_max : m[r];
      // m_new = -inf: no key visible yet (a row past the end); keep everything at 0.
      const C rescale = m_new == C(-INFINITY) ? C(0) : exp(m[r] - m_new);
      const C p = visible ? exp(s - m_new) : C(0);
      l[r] = l[r] * rescale + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) acc[r][i] *= rescale;
      p_s[(warp * kRowsPerWarp + r) * kTile + lane] = p;
    }
    __syncwarp();

    // acc += P V over the tile's keys.
    accumulate_tile<C, kChunks>(acc, p_s + warp * kRowsPerWarp * kTile, v_s, dv, keys, dv, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (pos[r] < 0) continue;
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    const int hh = static_cast<int>(row - pos[r] * a.group);
    const int64_t head = int64_t(g) * a.group + hh;
    const int64_t base = row_offset(b, pos[r], head, a.seq, a.heads, dv);
    C inv_l = C(1) / l[r];  // l >= 1: the row's maximum contributes exp(0)
    C row_lse = m[r] + log(l[r]);
    if (a.sinks != nullptr) {
      // Fold the sink's column in: m' = max(m, s), l' = l exp(m - m') + exp(s - m').
      // NOTES: every row that exists sees its own key, so m is finite; a -inf sink adds exactly
      // 0 (and m' = -inf, possible only then, keeps everything as without the sink). A NaN sink
      // gives NaN.
      const C sink = load_as<C>(a.sinks, head);
      const C m_new = sink > m[r] ? sink : m[r];
      const C keep = m_new == C(-INFINITY) ? C(1) : exp(m[r] - m_new);
      const C sink_p = m_new == C(-INFINITY) ? C(0) : exp(sink - m_new);
      const C l_new = l[r] * keep + sink_p;
      inv_l = keep / l_new;
      row_lse = m_new + log(l_new);
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c < dv) store_from(a.out, base + c, acc[r][i] * inv_l);
    }
    if (lane == 0) store_from(a.lse, lse_index(b, g, row, a.group, a.heads, a.seq), row_lse);
  }
}

// dq. Grid and row blocks as the forward. Shared: Q and dout rows (kBlockRows x dqk and x dv),
// K and V tiles (kTile x (dqk | 1) and x (dv | 1)), dS (kBlockRows x kTile). kChunks covers dqk
// (the accumulator).
template <typename T, int kChunks>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_dq_kernel(const AttentionArgs<T> a) {
  using C = compute_t<T>;
  const int dqk = a.qk_dim, dv = a.v_dim, ks = lane_stride(dqk), vs = lane_stride(dv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const C scale = static_cast<C>(a.scale);

  C* q_s = reinterpret_cast<C*>(attention_smem);
  C* do_s = q_s + kBlockRows * dqk;
  C* k_s = do_s + kBlockRows * dv;
  C* v_s = k_s + kTile * ks;
  C* ds_s = v_s + kTile * vs;

  load_query_rows(a.q, a, b, g, row0, kBlockRows, dqk, dqk, q_s);
  load_query_rows(a.dout, a, b, g, row0, kBlockRows, dv, dv, do_s);
  __syncthreads();

  int64_t pos[kRowsPerWarp], lo[kRowsPerWarp];  // as in the forward
  C row_lse[kRowsPerWarp], row_delta[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    pos[r] = row < rows_total ? row / a.group : -1;
    lo[r] = row_first_key(a, b, pos[r]);
    // D = dout . out of the row, lse of the row (0 past the last row, never used).
    C partial = C(0);
    row_lse[r] = C(0);
    if (pos[r] >= 0) {
      const int hh = static_cast<int>(row - pos[r] * a.group);
      const int64_t base = row_offset(b, pos[r], int64_t(g) * a.group + hh, a.seq, a.heads, dv);
      const C* do_row = do_s + (warp * kRowsPerWarp + r) * dv;
      for (int c = lane; c < dv; c += 32) partial += do_row[c] * load_as<C>(a.out, base + c);
      row_lse[r] = load_as<C>(a.lse, lse_index(b, g, row, a.group, a.heads, a.seq));
    }
    row_delta[r] = warp_sum(partial);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) acc[r][i] = C(0);
  }
  const int64_t last_row = (row0 + kBlockRows < rows_total ? row0 + kBlockRows : rows_total) - 1;
  const int64_t last_pos = last_row / a.group;

  for (int64_t s0 = first_visible_key(a, b, row0); s0 <= last_pos; s0 += kTile) {
    const int keys = static_cast<int>(last_pos + 1 - s0 < kTile ? last_pos + 1 - s0 : kTile);
    __syncthreads();
    load_key_rows(a.k, a, b, g, s0, keys, dqk, ks, k_s);
    load_key_rows(a.v, a, b, g, s0, keys, dv, vs, v_s);
    __syncthreads();

    // This lane's key: scores q.k and dp = dout.v against the warp's rows.
    const int64_t key = s0 + lane;
    C score[kRowsPerWarp], dp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) score[r] = dp[r] = C(0);
    if (lane < keys) {
      const C* k_row = k_s + lane * ks;
      const C* v_row = v_s + lane * vs;
      const C* q_rows = q_s + warp * kRowsPerWarp * dqk;
      const C* do_rows = do_s + warp * kRowsPerWarp * dv;
      // NOTES: the columns both products have run in one loop, the rest of the wider one after
      // it: each sum still runs in column order, so dv = dqk is the one-loop code it was.
      const int both = dqk < dv ? dqk : dv;
      for (int c = 0; c < both; ++c) {
        const C kc = k_row[c], vc = v_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          score[r] += q_rows[r * dqk + c] * kc;
          dp[r] += do_rows[r * dv + c] * vc;
        }
      }
      for (int c = both; c < dqk; ++c) {
        const C kc = k_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) score[r] += q_rows[r * dqk + c] * kc;
      }
      for (int c = both; c < dv; ++c) {
        const C vc = v_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) dp[r] += do_rows[r * dv + c] * vc;
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool visible = lane < keys && key <= pos[r] && key >= lo[r];
      const C p = visible ? exp(score[r] * scale - row_lse[r]) : C(0);
      ds_s[(warp * kRowsPerWarp + r) * kTile + lane] = p * (dp[r] - row_delta[r]);
    }
    __syncwarp();

    // acc += dS K over the tile's keys.
    accumulate_tile<C, kChunks>(acc, ds_s + warp * kRowsPerWarp * kTile, k_s, ks, keys, dqk, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (pos[r] < 0) continue;
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    const int hh = static_cast<int>(row - pos[r] * a.group);
    const int64_t base = row_offset(b, pos[r], int64_t(g) * a.group + hh, a.seq, a.heads, dqk);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c < dqk) store_from(a.dq, base + c, acc[r][i] * scale);
    }
  }
}

// dk, dv. Grid (ceil(T / kBlockRows), nkv, B): a block owns kBlockRows keys of (b, g), a warp
// kRowsPerWarp of them. Shared: K and V rows of the block (kBlockRows x dqk and x dv), Q and dout
// tiles (kTile x (dqk | 1) and x (dv | 1)), the tile's lse and D (kTile each), P and dS
// (kBlockRows x kTile each). kChunks covers the larger of dqk and dv (dk's and dv's accumulators
// use the chunks of their own width).
template <typename T, int kChunks>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_dkv_kernel(const AttentionArgs<T> a) {
  using C = compute_t<T>;
  const int dqk = a.qk_dim, dv = a.v_dim, qs = lane_stride(dqk), dos = lane_stride(dv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t key0 = int64_t(blockIdx.x) * kBlockRows;
  const C scale = static_cast<C>(a.scale);

  C* k_s = reinterpret_cast<C*>(attention_smem);
  C* v_s = k_s + kBlockRows * dqk;
  C* q_s = v_s + kBlockRows * dv;
  C* do_s = q_s + kTile * qs;
  C* lse_s = do_s + kTile * dos;
  C* delta_s = lse_s + kTile;
  C* p_s = delta_s + kTile;
  C* ds_s = p_s + kBlockRows * kTile;

  load_key_rows(a.k, a, b, g, key0, kBlockRows, dqk, dqk, k_s);
  load_key_rows(a.v, a, b, g, key0, kBlockRows, dv, dv, v_s);

  int64_t key[kRowsPerWarp];      // the warp's keys (keys past T are never visible)
  int64_t key_end[kRowsPerWarp];  // positions t < key_end see the key: t < key + W with a window,
                                  // t < document_end with documents (no bound without either)
  C dk_acc[kRowsPerWarp][kChunks], dv_acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    key[r] = key0 + warp * kRowsPerWarp + r;
    key_end[r] = a.window > 0 ? key[r] + a.window : INT64_MAX;
    if (a.doc_start != nullptr && key[r] < a.seq) {
      const int64_t doc_end = cuda::document_end(a.doc_start, b, a.seq, key[r]);
      key_end[r] = doc_end < key_end[r] ? doc_end : key_end[r];
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) dk_acc[r][i] = dv_acc[r][i] = C(0);
  }

  // Query rows from the block's first position (rows of earlier positions see none of its keys)
  // to the last row that sees one: T G, or with a window the rows of positions < last key + W,
  // and with documents those of positions < the end of the last key's document (the keys'
  // document ends grow with the key, so the last key's is the block's).
  const int64_t last_key = (key0 + kBlockRows < a.seq ? key0 + kBlockRows : a.seq) - 1;
  int64_t rows_end = a.window > 0 && (last_key + a.window) * a.group < rows_total
                         ? (last_key + a.window) * a.group
                         : rows_total;
  if (a.doc_start != nullptr) {
    const int64_t doc_rows_end = cuda::document_end(a.doc_start, b, a.seq, last_key) * a.group;
    rows_end = doc_rows_end < rows_end ? doc_rows_end : rows_end;
  }
  for (int64_t row0 = key0 * a.group; row0 < rows_end; row0 += kTile) {
    const int rows = static_cast<int>(rows_end - row0 < kTile ? rows_end - row0 : kTile);
    __syncthreads();  // the previous tile is consumed (and, the first time, K and V are loaded)
    load_query_rows(a.q, a, b, g, row0, kTile, dqk, qs, q_s);
    load_query_rows(a.dout, a, b, g, row0, kTile, dv, dos, do_s);
    __syncthreads();
    // lse and D = dout . out of the tile's rows, a warp per row.
    for (int j = warp; j < kTile; j += kWarps) {
      const int64_t row = row0 + j;
      C partial = C(0), row_lse = C(0);
      if (row < rows_total) {
        const int64_t t = row / a.group;
        const int hh = static_cast<int>(row - t * a.group);
        const int64_t base = row_offset(b, t, int64_t(g) * a.group + hh, a.seq, a.heads, dv);
        for (int c = lane; c < dv; c += 32)
          partial += do_s[j * dos + c] * load_as<C>(a.out, base + c);
        row_lse = load_as<C>(a.lse, lse_index(b, g, row, a.group, a.heads, a.seq));
      }
      const C delta = warp_sum(partial);
      if (lane == 0) {
        lse_s[j] = row_lse;
        delta_s[j] = delta;
      }
    }
    __syncthreads();

    // This lane's query row against the warp's keys: scores q.k and dp = dout.v.
    const int64_t row = row0 + lane;
    const int64_t t = row < rows_total ? row / a.group : -1;
    C score[kRowsPerWarp], dp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) score[r] = dp[r] = C(0);
    if (lane < rows) {
      const C* q_row = q_s + lane * qs;
      const C* do_row = do_s + lane * dos;
      const C* k_rows = k_s + warp * kRowsPerWarp * dqk;
      const C* v_rows = v_s + warp * kRowsPerWarp * dv;
      const int both = dqk < dv ? dqk : dv;  // as in the dq kernel
      for (int c = 0; c < both; ++c) {
        const C qc = q_row[c], dc = do_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          score[r] += qc * k_rows[r * dqk + c];
          dp[r] += dc * v_rows[r * dv + c];
        }
      }
      for (int c = both; c < dqk; ++c) {
        const C qc = q_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) score[r] += qc * k_rows[r * dqk + c];
      }
      for (int c = both; c < dv; ++c) {
        const C dc = do_row[c];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) dp[r] += dc * v_rows[r * dv + c];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      // t = -1 past the last row
      const bool visible = lane < rows && key[r] <= t && t < key_end[r];
      const C p = visible ? exp(score[r] * scale - lse_s[lane]) : C(0);
      p_s[(warp * kRowsPerWarp + r) * kTile + lane] = p;
      ds_s[(warp * kRowsPerWarp + r) * kTile + lane] = p * (dp[r] - delta_s[lane]);
    }
    __syncwarp();

    // dv += P^T dout, dk += dS^T Q over the tile's rows.
    const C* p_rows = p_s + warp * kRowsPerWarp * kTile;
    const C* ds_rows = ds_s + warp * kRowsPerWarp * kTile;
    for (int j = 0; j < rows; ++j) {
      C p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        p[r] = p_rows[r * kTile + j];
        ds[r] = ds_rows[r * kTile + j];
      }
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = lane + 32 * i;
        if (c < dv) {
          const C doc = do_s[j * dos + c];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) dv_acc[r][i] += p[r] * doc;
        }
        if (c < dqk) {
          const C qc = q_s[j * qs + c];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) dk_acc[r][i] += ds[r] * qc;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (key[r] >= a.seq) continue;
    const int64_t k_base = row_offset(b, key[r], g, a.seq, a.kv_heads, dqk);
    const int64_t v_base = row_offset(b, key[r], g, a.seq, a.kv_heads, dv);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c < dqk) store_from(a.dk, k_base + c, dk_acc[r][i] * scale);
      if (c < dv) store_from(a.dv, v_base + c, dv_acc[r][i]);
    }
  }
}

// ---- Host ---------------------------------------------------------------------------------------

// Shared-memory bytes of each kernel for head dims dqk, dv and compute type C (the regions the
// kernels carve out of attention_smem, in their order).
template <typename C>
size_t forward_smem(int dqk, int dv) {
  return sizeof(C) * (size_t(kBlockRows) * dqk + size_t(kTile) * lane_stride(dqk) +
                      size_t(kTile) * dv + size_t(kBlockRows) * kTile);
}
template <typename C>
size_t dq_smem(int dqk, int dv) {
  return sizeof(C) *
         (size_t(kBlockRows) * (dqk + dv) + size_t(kTile) * (lane_stride(dqk) + lane_stride(dv)) +
          size_t(kBlockRows) * kTile);
}
template <typename C>
size_t dkv_smem(int dqk, int dv) {
  return sizeof(C) *
         (size_t(kBlockRows) * (dqk + dv) + size_t(kTile) * (lane_stride(dqk) + lane_stride(dv)) +
          2 * size_t(kTile) + 2 * size_t(kBlockRows) * kTile);
}

// Checks what the kernels add to the op's argument checks (head dims, grid limits).
void check_cuda_limits(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t batch = q.size(0), seq = q.size(1), heads = q.size(2), kv_heads = k.size(2);
  if (q.size(3) > kMaxHeadDim || v.size(3) > kMaxHeadDim)
    MOEPEAK_THROW(op, " on CUDA supports head dims dqk and dv up to ", kMaxHeadDim, ", got q ",
                  q.str(), ", v ", v.str());
  if (batch > 65535 || kv_heads > 65535)
    MOEPEAK_THROW(op, " on CUDA supports B and nkv up to 65535, got q ", q.str(), ", k ", k.str());
  if ((seq * (heads / kv_heads) + kBlockRows - 1) / kBlockRows > INT_MAX)
    MOEPEAK_THROW(op, " on CUDA: q ", q.str(), " has too many query rows per kv head");
}

// The accumulator chunks per lane (columns lane + 32 i, i < chunks) of a d-wide row, d <= 256.
int chunks_for(int64_t d) { return d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : 8; }

// The window the kernels get: a W >= T cuts nothing, so it runs as plain causal attention (0).
int64_t kernel_window(const Tensor& q, const AttentionVariant& variant) {
  return variant.window > 0 && variant.window < q.size(1) ? variant.window : 0;
}

template <typename T>
AttentionArgs<T> make_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const AttentionVariant& variant, const Tensor* dout,
                           double scale, const Tensor* dq, const Tensor* dk, const Tensor* dv) {
  AttentionArgs<T> a{};
  a.doc_start =
      variant.doc_start.defined() ? static_cast<const int32_t*>(variant.doc_start.data()) : nullptr;
  a.q = static_cast<const T*>(q.data());
  a.k = static_cast<const T*>(k.data());
  a.v = static_cast<const T*>(v.data());
  a.out = static_cast<T*>(out.data());
  a.lse = static_cast<compute_t<T>*>(lse.data());
  a.sinks = variant.sinks.defined() ? static_cast<const T*>(variant.sinks.data()) : nullptr;
  a.window = kernel_window(q, variant);
  if (dout != nullptr) {
    a.dout = static_cast<const T*>(dout->data());
    a.dq = static_cast<T*>(dq->data());
    a.dk = static_cast<T*>(dk->data());
    a.dv = static_cast<T*>(dv->data());
  }
  a.seq = q.size(1);
  a.heads = static_cast<int>(q.size(2));
  a.kv_heads = static_cast<int>(k.size(2));
  a.group = a.heads / a.kv_heads;
  a.qk_dim = static_cast<int>(q.size(3));
  a.v_dim = static_cast<int>(v.size(3));
  a.scale = scale;
  return a;
}

// Calls f(std::integral_constant<int, chunks>{}) for chunks in {1, 2, 4, 8}.
template <typename F>
void dispatch_chunks(int chunks, F&& f) {
  switch (chunks) {
    case 1:
      f(std::integral_constant<int, 1>{});
      return;
    case 2:
      f(std::integral_constant<int, 2>{});
      return;
    case 4:
      f(std::integral_constant<int, 4>{});
      return;
    default:
      f(std::integral_constant<int, 8>{});
      return;
  }
}

dim3 row_grid(const Tensor& q, const Tensor& k) {
  const int64_t rows = q.size(1) * (q.size(2) / k.size(2));
  return dim3(static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows),
              static_cast<unsigned>(k.size(2)), static_cast<unsigned>(q.size(0)));
}

}  // namespace

void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const AttentionVariant& variant, const Tensor& out, const Tensor& lse,
                            Stream& stream) {
  const char* op = "attention_forward_cuda";
  check_attention_forward_args(q, k, v, scale, variant, out, lse);
  if (q.numel() == 0) return;      // B = 0 or T = 0 (nh, dqk, dv >= 1 by the checks)
  check_cuda_limits(op, q, k, v);  // both paths: head dims, grid limits
  if (attention_tc_takes(q, k, v, out)) {
    attention_forward_tc(q, k, v, scale, kernel_window(q, variant), variant.sinks,
                         variant.doc_start, out, lse, stream);
    return;
  }
  const dim3 grid = row_grid(q, k);
  cuda::dispatch_storage(q.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const AttentionArgs<T> a =
        make_args<T>(q, k, v, out, lse, variant, nullptr, scale, nullptr, nullptr, nullptr);
    dispatch_chunks(chunks_for(a.v_dim), [&](auto chunk_count) {
      constexpr int kChunks = decltype(chunk_count)::value;
      auto kernel = attention_forward_kernel<T, kChunks>;
      const size_t smem = forward_smem<compute_t<T>>(a.qk_dim, a.v_dim);
      cuda::allow_dynamic_smem(kernel, smem, op, "q " + q.str() + ", v " + v.str());
      kernel<<<grid, kBlockThreads, smem, cuda::native(stream)>>>(a);
      MOEPEAK_CUDA_LAUNCH_CHECK();
    });
  });
}

const char* attention_kernels_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out) {
  return attention_tc_takes(q, k, v, out) ? "cuda: tensor cores (bf16 WMMA)" : "cuda: SIMT";
}

void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, double scale,
                             const AttentionVariant& variant, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dsinks, Stream& stream) {
  const char* op = "attention_backward_cuda";
  check_attention_backward_args(q, k, v, out, lse, dout, scale, variant, dq, dk, dv, dsinks);
  if (q.numel() == 0) return;      // dsinks += an empty sum
  check_cuda_limits(op, q, k, v);  // both paths: head dims, grid limits
  // The sink changes only lse and out (already in them), so dq, dk, dv are the plain backward's;
  // dsinks reads out, dout and lse and is independent of them.
  if (dsinks.defined()) attention_dsinks_cuda(q, out, lse, dout, variant.sinks, dsinks, stream, op);
  if (attention_tc_takes(q, k, v, out, &dout, &dq, &dk, &dv)) {
    attention_backward_tc(q, k, v, out, lse, dout, scale, kernel_window(q, variant),
                          variant.doc_start, dq, dk, dv, stream);
    return;
  }
  const dim3 grid_rows = row_grid(q, k);
  const dim3 grid_keys(static_cast<unsigned>((q.size(1) + kBlockRows - 1) / kBlockRows),
                       static_cast<unsigned>(k.size(2)), static_cast<unsigned>(q.size(0)));
  cuda::dispatch_storage(q.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const AttentionArgs<T> a =
        make_args<T>(q, k, v, out, lse, variant, &dout, scale, &dq, &dk, &dv);
    using C = compute_t<T>;
    dispatch_chunks(chunks_for(a.qk_dim), [&](auto chunk_count) {
      constexpr int kChunks = decltype(chunk_count)::value;
      auto dq_kernel = attention_backward_dq_kernel<T, kChunks>;
      const size_t dq_bytes = dq_smem<C>(a.qk_dim, a.v_dim);
      cuda::allow_dynamic_smem(dq_kernel, dq_bytes, op, "q " + q.str() + ", v " + v.str());
      dq_kernel<<<grid_rows, kBlockThreads, dq_bytes, cuda::native(stream)>>>(a);
      MOEPEAK_CUDA_LAUNCH_CHECK();
    });
    dispatch_chunks(chunks_for(std::max(a.qk_dim, a.v_dim)), [&](auto chunk_count) {
      constexpr int kChunks = decltype(chunk_count)::value;
      auto dkv_kernel = attention_backward_dkv_kernel<T, kChunks>;
      const size_t dkv_bytes = dkv_smem<C>(a.qk_dim, a.v_dim);
      cuda::allow_dynamic_smem(dkv_kernel, dkv_bytes, op, "q " + q.str() + ", v " + v.str());
      dkv_kernel<<<grid_keys, kBlockThreads, dkv_bytes, cuda::native(stream)>>>(a);
      MOEPEAK_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace moepeak::ops
