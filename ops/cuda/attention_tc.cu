// CUDA attention on tensor cores (see ops/cuda/attention_tc.h): causal grouped-query flash
// attention with an optional sliding window, attention sinks and packed documents, forward and
// backward, bf16
// storage, query/key head dim DQK and value head dim DV each in {32, 64, 128, 192, 256} (pairs
// whose shared memory fits, attention_tc_takes); every product of two tiles is a bf16 WMMA
// 16x16x16 with fp32 accumulation, everything else is fp32.
//
//   q, dq: (B, T, nh, DQK) bf16     k, dk: (B, T, nkv, DQK) bf16    v, dv: (B, T, nkv, DV) bf16
//   out, dout: (B, T, nh, DV) bf16  lse: (B, nh, T) f32             sinks: (nh) bf16, into fp32
//   doc_start: (B, T) i32
//
// Q K^T, dS K and dS^T Q run over DQK (their tiles and accumulators DQK wide), P V, dO V^T and
// P^T dO over DV; each kernel is a template on both.
//
// As in the SIMT kernels (ops/cuda/attention.cu), the query rows of kv head g are flattened as
// row = t * G + hh (G = nh / nkv), so a block reads each K/V tile once for all the group's heads.
// A block is 4 warps; a warp owns 16 of the block's 64 rows (or keys) and streams tiles of 64
// entries of the other operand through shared memory:
//
//   forward  (rows, streaming keys 0..last position, or from the block's first row's first key:
//            with a window W its position - W + 1, with documents raised to its doc_start):
//            S = Q K^T (16 x 64 per warp, fp32 in shared
//            memory); per row online softmax (running max m and sum l), P = exp(scale S - m)
//            rounded to bf16, l sums the rounded P; the fp32 accumulator O (shared memory) is
//            rescaled by exp(m_old - m) and O += P V on tensor cores; out = O / l, lse = m + log l.
//            A sink s_h is folded in at the end in fp32 (not rounded: it is in no product):
//            m' = max(m, s_h), l' = l exp(m - m') + exp(s_h - m'), out = O exp(m - m') / l',
//            lse = m' + log l'.
//   dq       (rows, streaming keys):  S = Q K^T, dP = dO V^T; P = exp(scale S - lse);
//            dS = scale P (dP - Drow) rounded to bf16; dQ += dS K.  Drow = dout . out per row.
//   dk, dv   (keys, streaming query rows of every head of the group from the block's first
//            position to T, or with a window or documents to the last position that sees the
//            block's last key):  S^T = K Q^T, dP^T = V dO^T; P^T and dS^T as above; dV += P^T dO,
//            dK += dS^T Q. Each key row belongs to one block: written (=), no atomics.
// Window W > 0 (0 < W < T; the caller passes 0 for plain causal and for W >= T): row t sees keys
// t - W < s <= t. Documents (doc_start, ops/cuda/attention_documents.cuh): row t sees keys
// s >= doc_start[b][t] too. Tiles outside every row's window and document are skipped by the loop
// bounds (O(T W) work, O(sum L_i^2) for documents of lengths L_i); tiles the window or a document
// cuts are masked per element. With W = 0, no sinks and no documents the arithmetic is exactly
// the plain causal kernels'.
//
// Shared memory holds the bf16 tiles with a row stride of D + 8 elements (D = DQK or DV, the
// tile's width; WMMA wants 16-byte multiples; the 8-element skew spreads rows over the banks), the
// fp32 accumulators with D + 4, the fp32 score tiles with 68 floats, the bf16 probability tiles
// with 72; every region starts on a 128-byte boundary (WMMA wants 32). A pair of head dims runs
// here only if its kernels' shared memory fits sm_90's 227 KiB per block (Smem::kFits); the dk/dv
// kernel needs the most, 512 (DQK + DV) + 59904 bytes. A lane's element-wise work covers row
// (lane & 15), columns (lane >> 4) * 32 + i in a rotated order ((i + row + 16 half) & 31) so the
// 32 lanes hit 32 different banks of a score tile.
// Every sum has a fixed order: results are bitwise reproducible run to run. Masked keys (after a
// row's position, or before its window or document) get exactly p = 0 and are never
// exponentiated; tiles are zero-filled past T.
// Test: ctest -L cuda -R test_backend_ops (the bf16 attention cases with head dims 32 to 256).
#include "ops/cuda/attention_tc.h"

#include <mma.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/cuda/attention_documents.cuh"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 64;        // rows (forward, dq) or keys (dk/dv) a block owns: 16 per warp
constexpr int kTile = 64;        // entries of the streamed operand per tile
constexpr int kLdS = kTile + 4;  // fp32 score tiles (16 x kTile per warp)
constexpr int kLdP = kTile + 8;  // bf16 probability tiles (16 x kTile per warp)

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The shared-memory tiles of a D-wide operand: D = DQK for Q, K and the dQ, dK accumulators,
// D = DV for V, dO and the O, dV accumulators.
template <int D>
struct Tiles {
  static constexpr int kLdH = D + 8;  // bf16 tiles (Q, K, V, dO): 64 x D
  static constexpr int kLdO = D + 4;  // fp32 accumulators (O, dQ, dK, dV): 64 x D
  static constexpr size_t kTileBytes = size_t(kRows) * kLdH * sizeof(bf16);
  static constexpr size_t kAccBytes = size_t(kRows) * kLdO * sizeof(float);
  static_assert(D % 16 == 0 && kTileBytes % 128 == 0 && kAccBytes % 128 == 0);
};
constexpr size_t kScoreBytes = size_t(kWarps) * 16 * kLdS * sizeof(float);
constexpr size_t kProbBytes = size_t(kWarps) * 16 * kLdP * sizeof(bf16);
constexpr size_t kRowVecBytes = size_t(kTile) * sizeof(float);
static_assert(kScoreBytes % 128 == 0 && kProbBytes % 128 == 0 && kRowVecBytes % 128 == 0);

// The most dynamic shared memory a block can opt into on sm_90 (H100, H200), the architecture the
// build targets (MOEPEAK_CUDA_ARCHITECTURES): pairs of head dims whose kernels need more run on
// the SIMT kernels instead.
constexpr size_t kSmemLimit = 227 * 1024;

// Each kernel's shared-memory bytes for head dims DQK and DV (the same on host and device; the
// kernels carve their regions out in this order).
template <int DQK, int DV>
struct Smem {
  using Qk = Tiles<DQK>;
  using V = Tiles<DV>;
  // forward: Q, K (DQK), V (DV) | S | P | O (DV)
  static constexpr size_t kForward =
      2 * Qk::kTileBytes + V::kTileBytes + kScoreBytes + kProbBytes + V::kAccBytes;
  // dq: Q (DQK), dO (DV), K (DQK), V (DV) | S, dP | dS | dQ (DQK)
  static constexpr size_t kDq =
      2 * Qk::kTileBytes + 2 * V::kTileBytes + 2 * kScoreBytes + kProbBytes + Qk::kAccBytes;
  // dk/dv: K (DQK), V (DV), Q (DQK), dO (DV) | S^T, dP^T | P^T, dS^T | dK (DQK), dV (DV) | lse,
  // Drow of the row tile
  static constexpr size_t kDkv = 2 * Qk::kTileBytes + 2 * V::kTileBytes + 2 * kScoreBytes +
                                 2 * kProbBytes + Qk::kAccBytes + V::kAccBytes + 2 * kRowVecBytes;
  // NOTES: dk/dv needs the most: 512 (DQK + DV) + 59904 bytes, so a pair fits when
  // DQK + DV <= 337: (128, 128) and (192, 128) do, (192, 192) and (256, 256) do not.
  static constexpr bool kFits = kForward <= kSmemLimit && kDq <= kSmemLimit && kDkv <= kSmemLimit;
};

struct TcArgs {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* dout;
  bf16* out;
  float* lse;
  bf16* dq;
  bf16* dk;
  bf16* dv;
  const bf16* sinks;         // (nh), or nullptr: no sinks (forward only)
  int64_t window;            // 0: causal; else 0 < W < T
  const int32_t* doc_start;  // (B, T), or nullptr: one document per sequence
  int64_t seq;               // T
  int heads;                 // nh
  int kv_heads;              // nkv
  int group;                 // G
  float scale;
};

extern __shared__ __align__(128) unsigned char attention_tc_smem[];

// Element offset of flattened query row `row` of (b, g) in a (B, T, nh, D) tensor; -1 past T G.
template <int D>
__device__ __forceinline__ int64_t query_offset(const TcArgs& a, int64_t b, int g, int64_t row) {
  if (row >= a.seq * a.group) return -1;
  const int64_t t = row / a.group, hh = row - t * a.group;
  return ((b * a.seq + t) * a.heads + int64_t(g) * a.group + hh) * D;
}
// Element offset of key `key` of kv head g in a (B, T, nkv, D) tensor; -1 past T.
template <int D>
__device__ __forceinline__ int64_t key_offset(const TcArgs& a, int64_t b, int g, int64_t key) {
  if (key >= a.seq) return -1;
  return ((b * a.seq + key) * a.kv_heads + g) * D;
}
// The first key any row of a block of sequence b starting at flattened row row0 (< T G) sees,
// its first row's (0 without a window or documents; no later row sees an earlier key), and the
// first key position `pos` sees (0 without a window: keys are >= 0, so it masks nothing), raised
// to its document's first position with documents (pos = -1, a row past the end, sees nothing
// whatever it returns).
__device__ __forceinline__ int64_t first_visible_key(const TcArgs& a, int64_t b, int64_t row0) {
  const int64_t first_pos = row0 / a.group;
  int64_t first = a.window > 0 && first_pos >= a.window ? first_pos - a.window + 1 : 0;
  if (a.doc_start != nullptr) {
    const int64_t doc = cuda::document_start(a.doc_start, b, a.seq, first_pos);
    first = doc > first ? doc : first;
  }
  return first;
}
__device__ __forceinline__ int64_t row_first_key(const TcArgs& a, int64_t b, int64_t pos) {
  int64_t first = a.window > 0 ? pos - a.window + 1 : 0;
  if (a.doc_start != nullptr && pos >= 0) {
    const int64_t doc = cuda::document_start(a.doc_start, b, a.seq, pos);
    first = doc > first ? doc : first;
  }
  return first;
}
// Index in lse (B, nh, T) of flattened row `row` of (b, g) (row < T G).
__device__ __forceinline__ int64_t lse_index(const TcArgs& a, int64_t b, int g, int64_t row) {
  const int64_t t = row / a.group, hh = row - t * a.group;
  return (b * a.heads + int64_t(g) * a.group + hh) * a.seq + t;
}

// Copies 64 rows of D bf16 into a tile (row stride D + 8), 16 bytes per load, by the whole
// block; row r comes from element offset offset_of(r) of src, or is zero where that is -1.
template <int D, typename OffsetOf>
__device__ void load_tile(const bf16* src, OffsetOf offset_of, bf16* tile) {
  constexpr int kVecs = D / 8;
  for (int i = threadIdx.x; i < kRows * kVecs; i += kThreads) {
    const int r = i / kVecs, c = (i - r * kVecs) * 8;
    const int64_t off = offset_of(r);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (off >= 0) value = *reinterpret_cast<const uint4*>(src + off + c);
    *reinterpret_cast<uint4*>(tile + r * Tiles<D>::kLdH + c) = value;
  }
}

// The 16 x D row block of a bf16 tile at `rows` as D/16 matrix_a fragments.
template <int D>
__device__ __forceinline__ void load_a_rows(FragA (&frag)[D / 16], const bf16* rows) {
#pragma unroll
  for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(frag[k], rows + k * 16, Tiles<D>::kLdH);
}

// out (16 x 64 fp32, stride kLdS) = A (16 x D, fragments) x tile^T, tile = 64 rows x D: the
// scores of a warp's 16 rows against the 64 entries of a tile.
template <int D>
__device__ __forceinline__ void times_tile_transposed(const FragA (&a)[D / 16], const bf16* tile,
                                                      float* out) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragBCol b;  // tile^T (k, n) = tile[n][k]: column-major with the tile's row stride
      wmma::load_matrix_sync(b, tile + n * 16 * Tiles<D>::kLdH + k * 16, Tiles<D>::kLdH);
      wmma::mma_sync(acc, a[k], b, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc (16 x D fp32 in shared memory, stride kLdO) += W (16 x 64 bf16, stride kLdP) x tile
// (64 rows x D): P V, dS K, P^T dO, dS^T Q.
template <int D>
__device__ __forceinline__ void accumulate_times_tile(const bf16* w, const bf16* tile,
                                                      float* acc_rows) {
  FragA wf[kTile / 16];
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) wmma::load_matrix_sync(wf[k], w + k * 16, kLdP);
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    FragAcc acc;
    wmma::load_matrix_sync(acc, acc_rows + j * 16, Tiles<D>::kLdO, wmma::mem_row_major);
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
      FragBRow b;
      wmma::load_matrix_sync(b, tile + k * 16 * Tiles<D>::kLdH + j * 16, Tiles<D>::kLdH);
      wmma::mma_sync(acc, wf[k], b, acc);
    }
    wmma::store_matrix_sync(acc_rows + j * 16, acc, Tiles<D>::kLdO, wmma::mem_row_major);
  }
}

// The column a lane visits at step i of its 32 (see the file comment).
__device__ __forceinline__ int lane_column(int i, int row, int half) {
  return half * 32 + ((i + row + 16 * half) & 31);
}

// dout . out of one query row over the columns of `half` (D/2 of them, a multiple of 8; D = DV),
// in fp32 in column order: dout from the row's shared tile, out from global memory at element
// offset `off`, 16 bytes per load (0 for a row past T G, off < 0).
template <int D>
__device__ __forceinline__ float half_row_dot(const bf16* dout_row, const bf16* out, int64_t off,
                                              int half) {
  float sum = 0;
  if (off < 0) return sum;
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c += 8) {
    const uint4 packed = *reinterpret_cast<const uint4*>(out + off + c);
    const bf16* o = reinterpret_cast<const bf16*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += __bfloat162float(dout_row[c + e]) * __bfloat162float(o[e]);
  }
  return sum;
}

// ---- forward ------------------------------------------------------------------------------------
// Grid (ceil(T G / 64), nkv, B); the blocks of the last rows (the most keys) first.
template <int DQK, int DV>
__global__ void __launch_bounds__(kThreads) attention_tc_forward_kernel(const TcArgs a) {
  using Qk = Tiles<DQK>;
  using V = Tiles<DV>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;

  // Q, K, V | S | P | O (Smem::kForward)
  unsigned char* smem = attention_tc_smem;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + Qk::kTileBytes);
  bf16* v_s = reinterpret_cast<bf16*>(smem + 2 * Qk::kTileBytes);
  unsigned char* scores = smem + 2 * Qk::kTileBytes + V::kTileBytes;
  float* s_w = reinterpret_cast<float*>(scores) + warp * 16 * kLdS;
  bf16* p_w = reinterpret_cast<bf16*>(scores + kScoreBytes) + warp * 16 * kLdP;
  float* o_s = reinterpret_cast<float*>(scores + kScoreBytes + kProbBytes);
  float* o_w = o_s + warp * 16 * V::kLdO;

  load_tile<DQK>(
      a.q, [&](int r) { return query_offset<DQK>(a, b, g, row0 + r); }, q_s);

  const int rr = lane & 15, half = lane >> 4;
  const int64_t row = row0 + warp * 16 + rr;
  const int64_t pos = row < rows_total ? row / a.group : -1;  // -1: no key is visible
  const int64_t lo = row_first_key(a, b, pos);                // the row's first key
  float* o_row = o_w + rr * V::kLdO;
  for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) o_row[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  __syncthreads();  // Q is in shared memory
  FragA qf[DQK / 16];
  load_a_rows<DQK>(qf, q_s + warp * 16 * Qk::kLdH);

  const int64_t last_pos = ((row0 + kRows < rows_total ? row0 + kRows : rows_total) - 1) / a.group;
  for (int64_t s0 = first_visible_key(a, b, row0); s0 <= last_pos; s0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_tile<DQK>(
        a.k, [&](int r) { return key_offset<DQK>(a, b, g, s0 + r); }, k_s);
    load_tile<DV>(
        a.v, [&](int r) { return key_offset<DV>(a, b, g, s0 + r); }, v_s);
    __syncthreads();

    times_tile_transposed<DQK>(qf, k_s, s_w);
    __syncwarp();

    const float* s_row = s_w + rr * kLdS;
    float tile_max = -INFINITY;
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, rr, half);
      if (s0 + c <= pos && s0 + c >= lo) tile_max = fmaxf(tile_max, a.scale * s_row[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 16));
    const float m_new = fmaxf(m, tile_max);
    // NOTES: m_new = -inf only for a row that sees no key yet (or none at all): p = 0, l and O
    // stay 0, and alpha must not be exp(-inf - -inf) = NaN.
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
    bf16* p_row = p_w + rr * kLdP;
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, rr, half);
      const bool visible = s0 + c <= pos && s0 + c >= lo;
      const bf16 p = __float2bfloat16_rn(visible ? expf(a.scale * s_row[c] - m_new) : 0.0f);
      p_row[c] = p;
      sum += __bfloat162float(p);  // l sums the weights P V uses
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    l = l * alpha + sum;
    m = m_new;
    for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) o_row[c] *= alpha;
    __syncwarp();  // P and the rescaled O are in shared memory

    accumulate_times_tile<DV>(p_w, v_s, o_w);
    __syncwarp();  // O is stored before the next tile's rescale (and the epilogue) reads it
  }

  if (pos >= 0) {
    const int64_t off = query_offset<DV>(a, b, g, row);
    float inv = 1.0f / l;
    float row_lse = m + logf(l);
    if (a.sinks != nullptr) {
      // Fold the sink's column in (see the file comment). NOTES: every row that exists sees its
      // own key, so m is finite; a -inf sink adds exactly 0 (m' = -inf, possible only then,
      // keeps everything as without the sink); a NaN sink gives NaN.
      const float sink = __bfloat162float(a.sinks[int64_t(g) * a.group + (row - pos * a.group)]);
      const float m_new = fmaxf(m, sink);
      const float keep = m_new == -INFINITY ? 1.0f : expf(m - m_new);
      const float sink_p = m_new == -INFINITY ? 0.0f : expf(sink - m_new);
      const float l_new = l * keep + sink_p;
      inv = keep / l_new;
      row_lse = m_new + logf(l_new);
    }
    for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) {
      a.out[off + c] = __float2bfloat16_rn(o_row[c] * inv);
    }
    if (half == 0) a.lse[lse_index(a, b, g, row)] = row_lse;
  }
}

// ---- backward: dq -------------------------------------------------------------------------------
// Grid as the forward's.
template <int DQK, int DV>
__global__ void __launch_bounds__(kThreads) attention_tc_dq_kernel(const TcArgs a) {
  using Qk = Tiles<DQK>;
  using V = Tiles<DV>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t row0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;

  // Q, dO, K, V | S, dP | dS | dQ (Smem::kDq)
  unsigned char* smem = attention_tc_smem;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* do_s = reinterpret_cast<bf16*>(smem + Qk::kTileBytes);
  bf16* k_s = reinterpret_cast<bf16*>(smem + Qk::kTileBytes + V::kTileBytes);
  bf16* v_s = reinterpret_cast<bf16*>(smem + 2 * Qk::kTileBytes + V::kTileBytes);
  unsigned char* scores = smem + 2 * Qk::kTileBytes + 2 * V::kTileBytes;
  float* s_w = reinterpret_cast<float*>(scores) + warp * 16 * kLdS;
  float* dp_w = reinterpret_cast<float*>(scores + kScoreBytes) + warp * 16 * kLdS;
  bf16* ds_w = reinterpret_cast<bf16*>(scores + 2 * kScoreBytes) + warp * 16 * kLdP;
  float* dq_w =
      reinterpret_cast<float*>(scores + 2 * kScoreBytes + kProbBytes) + warp * 16 * Qk::kLdO;

  load_tile<DQK>(
      a.q, [&](int r) { return query_offset<DQK>(a, b, g, row0 + r); }, q_s);
  load_tile<DV>(
      a.dout, [&](int r) { return query_offset<DV>(a, b, g, row0 + r); }, do_s);

  const int rr = lane & 15, half = lane >> 4;
  const int64_t row = row0 + warp * 16 + rr;
  const int64_t pos = row < rows_total ? row / a.group : -1;
  const int64_t lo = row_first_key(a, b, pos);
  const int64_t dq_off = query_offset<DQK>(a, b, g, row);  // the row in q and dq
  const int64_t out_off = query_offset<DV>(a, b, g, row);  // the row in out and dout
  const float lse = pos >= 0 ? a.lse[lse_index(a, b, g, row)] : 0.0f;
  float* dq_row = dq_w + rr * Qk::kLdO;
  for (int c = half * (DQK / 2); c < (half + 1) * (DQK / 2); ++c) dq_row[c] = 0.0f;

  __syncthreads();  // Q and dO are in shared memory
  float d_row = half_row_dot<DV>(do_s + (warp * 16 + rr) * V::kLdH, a.out, out_off, half);
  d_row += __shfl_xor_sync(0xffffffffu, d_row, 16);
  FragA qf[DQK / 16], dof[DV / 16];
  load_a_rows<DQK>(qf, q_s + warp * 16 * Qk::kLdH);
  load_a_rows<DV>(dof, do_s + warp * 16 * V::kLdH);

  const int64_t last_pos = ((row0 + kRows < rows_total ? row0 + kRows : rows_total) - 1) / a.group;
  for (int64_t s0 = first_visible_key(a, b, row0); s0 <= last_pos; s0 += kTile) {
    __syncthreads();
    load_tile<DQK>(
        a.k, [&](int r) { return key_offset<DQK>(a, b, g, s0 + r); }, k_s);
    load_tile<DV>(
        a.v, [&](int r) { return key_offset<DV>(a, b, g, s0 + r); }, v_s);
    __syncthreads();

    times_tile_transposed<DQK>(qf, k_s, s_w);   // S = Q K^T
    times_tile_transposed<DV>(dof, v_s, dp_w);  // dP = dO V^T
    __syncwarp();

    const float* s_row = s_w + rr * kLdS;
    const float* dp_row = dp_w + rr * kLdS;
    bf16* ds_row = ds_w + rr * kLdP;
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, rr, half);
      float ds = 0.0f;
      if (s0 + c <= pos && s0 + c >= lo) {
        const float p = expf(a.scale * s_row[c] - lse);
        ds = a.scale * p * (dp_row[c] - d_row);
      }
      ds_row[c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();

    accumulate_times_tile<DQK>(ds_w, k_s, dq_w);  // dQ += dS K (scale folded into dS)
    __syncwarp();
  }

  if (pos >= 0) {
    for (int c = half * (DQK / 2); c < (half + 1) * (DQK / 2); ++c) {
      a.dq[dq_off + c] = __float2bfloat16_rn(dq_row[c]);
    }
  }
}

// ---- backward: dk, dv ---------------------------------------------------------------------------
// Grid (ceil(T / 64), nkv, B); block x owns keys [64 x, 64 x + 64), so block 0 (the most rows)
// comes first.
template <int DQK, int DV>
__global__ void __launch_bounds__(kThreads) attention_tc_dkv_kernel(const TcArgs a) {
  using Qk = Tiles<DQK>;
  using V = Tiles<DV>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows_total = a.seq * a.group;
  const int64_t key0 = int64_t(blockIdx.x) * kRows;

  // K, V, Q, dO | S^T, dP^T | P^T, dS^T | dK, dV | lse, Drow (Smem::kDkv)
  unsigned char* smem = attention_tc_smem;
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = reinterpret_cast<bf16*>(smem + Qk::kTileBytes);
  bf16* q_s = reinterpret_cast<bf16*>(smem + Qk::kTileBytes + V::kTileBytes);
  bf16* do_s = reinterpret_cast<bf16*>(smem + 2 * Qk::kTileBytes + V::kTileBytes);
  unsigned char* scores = smem + 2 * Qk::kTileBytes + 2 * V::kTileBytes;
  float* st_w = reinterpret_cast<float*>(scores) + warp * 16 * kLdS;
  float* dpt_w = reinterpret_cast<float*>(scores + kScoreBytes) + warp * 16 * kLdS;
  unsigned char* probs = scores + 2 * kScoreBytes;
  bf16* pt_w = reinterpret_cast<bf16*>(probs) + warp * 16 * kLdP;
  bf16* dst_w = reinterpret_cast<bf16*>(probs + kProbBytes) + warp * 16 * kLdP;
  unsigned char* accs = probs + 2 * kProbBytes;
  float* dk_w = reinterpret_cast<float*>(accs) + warp * 16 * Qk::kLdO;
  float* dv_w = reinterpret_cast<float*>(accs + Qk::kAccBytes) + warp * 16 * V::kLdO;
  float* lse_t = reinterpret_cast<float*>(accs + Qk::kAccBytes + V::kAccBytes);
  float* drow_t = lse_t + kTile;

  load_tile<DQK>(
      a.k, [&](int r) { return key_offset<DQK>(a, b, g, key0 + r); }, k_s);
  load_tile<DV>(
      a.v, [&](int r) { return key_offset<DV>(a, b, g, key0 + r); }, v_s);

  const int kk = lane & 15, half = lane >> 4;
  const int64_t key = key0 + warp * 16 + kk;
  float* dk_row = dk_w + kk * Qk::kLdO;
  float* dv_row = dv_w + kk * V::kLdO;
  for (int c = half * (DQK / 2); c < (half + 1) * (DQK / 2); ++c) dk_row[c] = 0.0f;
  for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) dv_row[c] = 0.0f;

  __syncthreads();  // K and V are in shared memory
  FragA kf[DQK / 16], vf[DV / 16];
  load_a_rows<DQK>(kf, k_s + warp * 16 * Qk::kLdH);
  load_a_rows<DV>(vf, v_s + warp * 16 * V::kLdH);

  // The first row that can see key0 is the first of position key0; the last that sees the
  // block's last key is the last of T - 1, or with a window of position last key + W - 1, or with
  // documents of the last position of the last key's document (the keys' document ends grow
  // with the key, so the last key's is the block's).
  const int64_t last_key = (key0 + kRows < a.seq ? key0 + kRows : a.seq) - 1;
  int64_t rows_end = a.window > 0 && (last_key + a.window) * a.group < rows_total
                         ? (last_key + a.window) * a.group
                         : rows_total;
  // key <= row / group, without a 64-bit divide per element: the first query row that sees
  // this key is key * group (rows are (position, head-in-group) pairs) ...
  const int64_t first_row_seeing_key = key * a.group;
  // ... and rows of positions key + W and later (with a window), or of positions past the key's
  // document (with documents), do not see it (no bound without either).
  int64_t end_row_seeing_key = a.window > 0 ? (key + a.window) * a.group : rows_total;
  if (a.doc_start != nullptr) {
    const int64_t doc_rows_end = cuda::document_end(a.doc_start, b, a.seq, last_key) * a.group;
    rows_end = doc_rows_end < rows_end ? doc_rows_end : rows_end;
    if (key < a.seq) {
      const int64_t key_rows_end = cuda::document_end(a.doc_start, b, a.seq, key) * a.group;
      end_row_seeing_key = key_rows_end < end_row_seeing_key ? key_rows_end : end_row_seeing_key;
    }
  }
  for (int64_t r0 = key0 * a.group; r0 < rows_end; r0 += kTile) {
    __syncthreads();  // the previous row tile is consumed
    auto out_rows_of = [&](int r) { return query_offset<DV>(a, b, g, r0 + r); };
    load_tile<DQK>(
        a.q, [&](int r) { return query_offset<DQK>(a, b, g, r0 + r); }, q_s);
    load_tile<DV>(a.dout, out_rows_of, do_s);
    __syncthreads();  // the tiles are in shared memory
    {
      // lse and D = dout . out of the tile's rows: two threads per row (lanes t and t ^ 1).
      const int r = threadIdx.x >> 1, part = threadIdx.x & 1;
      const int64_t off = out_rows_of(r);
      float dot = half_row_dot<DV>(do_s + r * V::kLdH, a.out, off, part);
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      if (part == 0) {
        drow_t[r] = dot;
        lse_t[r] = off >= 0 ? a.lse[lse_index(a, b, g, r0 + r)] : 0.0f;
      }
    }
    __syncthreads();  // lse and D of the tile's rows are in shared memory

    times_tile_transposed<DQK>(kf, q_s, st_w);   // S^T = K Q^T
    times_tile_transposed<DV>(vf, do_s, dpt_w);  // dP^T = V dO^T
    __syncwarp();

    const float* st_row = st_w + kk * kLdS;
    const float* dpt_row = dpt_w + kk * kLdS;
    bf16* pt_row = pt_w + kk * kLdP;
    bf16* dst_row = dst_w + kk * kLdP;
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, kk, half);
      const int64_t row = r0 + c;
      float p = 0.0f, ds = 0.0f;
      if (row < rows_total && row >= first_row_seeing_key && row < end_row_seeing_key) {
        p = expf(a.scale * st_row[c] - lse_t[c]);
        ds = a.scale * p * (dpt_row[c] - drow_t[c]);
      }
      pt_row[c] = __float2bfloat16_rn(p);
      dst_row[c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();

    accumulate_times_tile<DV>(pt_w, do_s, dv_w);   // dV += P^T dO
    accumulate_times_tile<DQK>(dst_w, q_s, dk_w);  // dK += dS^T Q
    __syncwarp();
  }

  if (key < a.seq) {
    const int64_t k_off = key_offset<DQK>(a, b, g, key), v_off = key_offset<DV>(a, b, g, key);
    for (int c = half * (DQK / 2); c < (half + 1) * (DQK / 2); ++c) {
      a.dk[k_off + c] = __float2bfloat16_rn(dk_row[c]);
    }
    for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) {
      a.dv[v_off + c] = __float2bfloat16_rn(dv_row[c]);
    }
  }
}

// ---- host ---------------------------------------------------------------------------------------

bool aligned16(const Tensor* t) {
  return t == nullptr || t->numel() == 0 || reinterpret_cast<uintptr_t>(t->data()) % 16 == 0;
}

TcArgs make_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const Tensor& lse, double scale, int64_t window, const Tensor& doc_start) {
  TcArgs a{};
  a.window = window;
  a.doc_start = doc_start.defined() ? static_cast<const int32_t*>(doc_start.data()) : nullptr;
  a.q = static_cast<const bf16*>(q.data());
  a.k = static_cast<const bf16*>(k.data());
  a.v = static_cast<const bf16*>(v.data());
  a.out = static_cast<bf16*>(out.data());
  a.lse = static_cast<float*>(lse.data());
  a.seq = q.size(1);
  a.heads = static_cast<int>(q.size(2));
  a.kv_heads = static_cast<int>(k.size(2));
  a.group = a.heads / a.kv_heads;
  a.scale = static_cast<float>(scale);
  return a;
}

// Calls f(std::integral_constant<int, D>{}) when d is one of the kernels' head dims (32, 64, 128,
// 192, 256) and returns true; false for any other d.
template <typename F>
bool with_head_dim(int64_t d, F&& f) {
  switch (d) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    case 192:
      f(std::integral_constant<int, 192>{});
      return true;
    case 256:
      f(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

// Whether the kernels exist for head dims (dqk, dv): each one of with_head_dim's, and the pair's
// shared memory within kSmemLimit (Smem::kFits).
bool head_dims_fit(int64_t dqk, int64_t dv) {
  bool fits = false;
  with_head_dim(dqk, [&](auto qk) {
    with_head_dim(dv, [&](auto v) {
      fits = Smem<std::decay_t<decltype(qk)>::value, std::decay_t<decltype(v)>::value>::kFits;
    });
  });
  return fits;
}

// Calls f(DQK, DV) (as std::integral_constants) for the call's head dims, a pair head_dims_fit
// accepted; only such pairs have kernels.
template <typename F>
void dispatch_head_dims(int64_t dqk, int64_t dv, const char* op, F&& f) {
  bool ran = false;
  with_head_dim(dqk, [&](auto qk) {
    with_head_dim(dv, [&](auto v) {
      if constexpr (Smem<std::decay_t<decltype(qk)>::value,
                         std::decay_t<decltype(v)>::value>::kFits) {
        f(qk, v);
        ran = true;
      }
    });
  });
  if (!ran) MOEPEAK_THROW(op, ": no tensor-core kernels for dqk = ", dqk, ", dv = ", dv);
}

dim3 row_grid(const Tensor& q, const Tensor& k) {
  const int64_t rows = q.size(1) * (q.size(2) / k.size(2));
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(k.size(2)),
              static_cast<unsigned>(q.size(0)));
}

}  // namespace

bool attention_tc_takes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor* dout, const Tensor* dq, const Tensor* dk, const Tensor* dv) {
  return q.dtype() == DType::bf16 && head_dims_fit(q.size(3), v.size(3)) && aligned16(&q) &&
         aligned16(&k) && aligned16(&v) && aligned16(&out) && aligned16(dout) && aligned16(dq) &&
         aligned16(dk) && aligned16(dv);
}

void attention_forward_tc(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                          int64_t window, const Tensor& sinks, const Tensor& doc_start,
                          const Tensor& out, const Tensor& lse, Stream& stream) {
  const char* op = "attention_forward_cuda (tensor cores)";
  if (q.numel() == 0) return;
  TcArgs a = make_args(q, k, v, out, lse, scale, window, doc_start);
  a.sinks = sinks.defined() ? static_cast<const bf16*>(sinks.data()) : nullptr;
  dispatch_head_dims(q.size(3), v.size(3), op, [&](auto qk_dim, auto v_dim) {
    constexpr int DQK = decltype(qk_dim)::value, DV = decltype(v_dim)::value;
    using S = Smem<DQK, DV>;
    auto kernel = attention_tc_forward_kernel<DQK, DV>;
    cuda::allow_dynamic_smem(kernel, S::kForward, op, "q " + q.str() + ", v " + v.str());
    kernel<<<row_grid(q, k), kThreads, S::kForward, cuda::native(stream)>>>(a);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void attention_backward_tc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, double scale, int64_t window,
                           const Tensor& doc_start, const Tensor& dq, const Tensor& dk,
                           const Tensor& dv, Stream& stream) {
  const char* op = "attention_backward_cuda (tensor cores)";
  if (q.numel() == 0) return;
  TcArgs a = make_args(q, k, v, out, lse, scale, window, doc_start);
  a.dout = static_cast<const bf16*>(dout.data());
  a.dq = static_cast<bf16*>(dq.data());
  a.dk = static_cast<bf16*>(dk.data());
  a.dv = static_cast<bf16*>(dv.data());
  const dim3 key_grid(static_cast<unsigned>((q.size(1) + kRows - 1) / kRows),
                      static_cast<unsigned>(k.size(2)), static_cast<unsigned>(q.size(0)));
  dispatch_head_dims(q.size(3), v.size(3), op, [&](auto qk_dim, auto v_dim) {
    constexpr int DQK = decltype(qk_dim)::value, DV = decltype(v_dim)::value;
    using S = Smem<DQK, DV>;
    auto dq_kernel = attention_tc_dq_kernel<DQK, DV>;
    auto dkv_kernel = attention_tc_dkv_kernel<DQK, DV>;
    const std::string what = "q " + q.str() + ", v " + v.str();
    cuda::allow_dynamic_smem(dq_kernel, S::kDq, op, what);
    cuda::allow_dynamic_smem(dkv_kernel, S::kDkv, op, what);
    dq_kernel<<<row_grid(q, k), kThreads, S::kDq, cuda::native(stream)>>>(a);
    MOEPEAK_CUDA_LAUNCH_CHECK();
    dkv_kernel<<<key_grid, kThreads, S::kDkv, cuda::native(stream)>>>(a);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
