// CPU attention: flash-style causal grouped-query attention, forward and backward (see
// ops/attention.h for the semantics).
//
//   q, dout, out, dq: (B, T, nh, d)    k, v, dk, dv: (B, T, nkv, d)    lse: (B, nh, T)
//
// Work is cut into query blocks: for batch b, kv head g and positions [t0, t0 + P), the block
// stacks the G = nh / nkv query heads of g, row r = (t - t0) * G + hh for query head g * G + hh.
// A position's G heads are adjacent in memory (G * d elements), so a block is copied in and out as
// P contiguous runs. Keys and values are read in place: rows of k[b, :, g, :] are nkv * d apart,
// which is the GEMM's leading dimension.
//
// Forward, per query block: for each key block up to the block's last position,
//   S = scale * Q K^T (GEMM), mask the keys past each row's position (diagonal blocks only),
//   m' = max(m, rowmax S), P = exp(S - m'), l = l * exp(m - m') + rowsum P,
//   acc = acc * exp(m - m') + P V (GEMM, beta = 1);
// then out = acc / l and lse = m + log l.
// Backward, per query block: D = rowsum(dout * out); for each key block,
//   P = exp(S - lse), dP = dout V^T, dV += P^T dout, dS = P * (dP - D),
//   dQ += scale * dS K, dK += scale * dS^T Q  (dK, dV straight into dk, dv with beta = 1).
// Masking writes exact zeros into P past each row's position (no -inf arithmetic), and a block's
// last key block stops at its last position, so keys after t never touch row t's bits.
// Query blocks run in a fixed order (b, g, t0), so dk/dv sum the blocks — and, inside a block's
// GEMM, the query heads of the group — in a fixed order: results are bitwise reproducible.
//
// bf16 storage (fp32 arithmetic, ops/cpu/cpu_storage.h): query rows are widened as they are
// gathered and every key/value block into scratch once per visit (rows d apart), the arithmetic
// is the f32 kernel's, and out, dq, dk, dv are rounded once as they are stored (lse is f32). The
// backward then runs two passes (backward_kernel_widened): dq by query blocks, dk/dv by key
// blocks, each key block's fp32 sums in scratch.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/runtime/cpu_stream.h"
#include "ops/attention.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

// ---- Problem geometry and block plan ------------------------------------------------------------

struct Geometry {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t group() const { return heads / kv_heads; }
  // Offset of element 0 of row (b, t, head) in a (B, T, heads_in_tensor, d) tensor.
  int64_t offset(int64_t b, int64_t t, int64_t head, int64_t heads_in_tensor) const {
    return ((b * seq + t) * heads_in_tensor + head) * head_dim;
  }
};

struct BlockPlan {
  int64_t group = 1;      // query heads per kv head (G)
  int64_t positions = 1;  // positions per query block (P)
  int64_t rows = 1;       // rows of a full query block, P * G
  int64_t keys = 1;       // keys per key block
};

BlockPlan plan_blocks(const Geometry& geo, AttentionBlocks blocks) {
  BlockPlan plan;
  plan.group = geo.group();
  plan.positions = std::max<int64_t>(1, blocks.query_rows / plan.group);
  plan.rows = plan.positions * plan.group;
  plan.keys = blocks.keys;
  return plan;
}

// ---- GEMM (row-major CBLAS) ---------------------------------------------------------------------

void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t m, int64_t n, int64_t k,
          double alpha, const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
          double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// ---- Row kernels: max, exp(x - shift) with its sum, dS = P * (dP - D) ---------------------------
// Generic versions (f64, and f32 without AVX2) use std::exp. The f32 AVX2 versions use a Cephes-
// style exp (degree-6 polynomial after range reduction, ~2 ulp) so the exponentials, about one per
// 4d GEMM FLOPs, do not dominate. Arguments below -87.3 give exactly 0.

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

#if defined(__x86_64__)

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_avx2(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3365447f);  // exp(lowest) = 2^-126
  const __m256 highest = _mm256_set1_ps(88.0f);
  __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, with ln2 split in two so that n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

// Loads min(n, 8) elements, the rest of the lanes set to `pad`.
__attribute__((target("avx2,fma"))) __m256 load_tail(const float* x, int64_t n, float pad) {
  alignas(32) float lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = i < n ? x[i] : pad;
  return _mm256_load_ps(lanes);
}

__attribute__((target("avx2,fma"))) void store_tail(float* x, int64_t n, __m256 value) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, value);
  for (int64_t i = 0; i < n; ++i) x[i] = lanes[i];
}

// Horizontal reductions in a fixed lane order.
__attribute__((target("avx2,fma"))) float lanes_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

__attribute__((target("avx2,fma"))) float lanes_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + 8);
}

__attribute__((target("avx2,fma"))) float row_max_avx2(const float* x, int64_t n) {
  __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) best = _mm256_max_ps(best, _mm256_loadu_ps(x + i));
  if (i < n) best = _mm256_max_ps(best, load_tail(x + i, n - i, -INFINITY));
  return lanes_max(best);
}

__attribute__((target("avx2,fma"))) float exp_shift_sum_avx2(float* x, int64_t n, float shift) {
  const __m256 shift_v = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift_v));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    __m256 e = exp_avx2(_mm256_sub_ps(load_tail(x + i, n - i, -INFINITY), shift_v));
    store_tail(x + i, n - i, e);
    sum = _mm256_add_ps(sum, e);  // padded lanes are exp(-inf) = 0
  }
  return lanes_sum(sum);
}

__attribute__((target("avx2,fma"))) void dscores_avx2(float* p_to_ds, const float* dp, int64_t n,
                                                      float d_row) {
  const __m256 d_v = _mm256_set1_ps(d_row);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(p_to_ds + i);
    _mm256_storeu_ps(p_to_ds + i, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + i), d_v)));
  }
  _mm256_zeroupper();  // as in widen_bf16_avx2
  dscores_generic(p_to_ds + i, dp + i, n - i, d_row);
}

#endif  // __x86_64__

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
  std::vector<T> q_rows;       // rows x d: the block's queries
  std::vector<T> dout_rows;    // rows x d: the block's output gradients (backward)
  std::vector<T> accumulator;  // rows x d: P V (forward) or dQ (backward)
  std::vector<T> scores;       // rows x keys: S, then P, then dS
  std::vector<T> dprobs;       // rows x keys: dP (backward)
  std::vector<T> row_max;      // rows: running max m (forward)
  std::vector<T> row_sum;      // rows: running sum l (forward) / lse (backward)
  std::vector<T> row_delta;    // rows: D = rowsum(dout * out) (backward)
  std::vector<T> k_block;      // keys x d: a widened key block (bf16 storage)
  std::vector<T> v_block;      // keys x d: a widened value block (bf16 storage)
  std::vector<T> dk_block;     // keys x d: dK of one key block (bf16 backward)
  std::vector<T> dv_block;     // keys x d: dV of one key block (bf16 backward)

  void reserve(const BlockPlan& plan, int64_t head_dim, bool backward, bool widened) {
    size_t rows = static_cast<size_t>(plan.rows);
    size_t row_block = rows * static_cast<size_t>(head_dim);
    size_t score_block = rows * static_cast<size_t>(plan.keys);
    q_rows.resize(row_block);
    accumulator.resize(row_block);
    scores.resize(score_block);
    row_sum.resize(rows);
    if (backward) {
      dout_rows.resize(row_block);
      dprobs.resize(score_block);
      row_delta.resize(rows);
    } else {
      row_max.resize(rows);
    }
    if (widened) {
      size_t key_block = static_cast<size_t>(plan.keys) * static_cast<size_t>(head_dim);
      k_block.resize(key_block);
      v_block.resize(key_block);
      if (backward) {
        dk_block.resize(key_block);
        dv_block.resize(key_block);
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

#if defined(__x86_64__)
// bf16 -> fp32 8 at a time (a bf16 is the top half of its fp32): exact, as widen() is.
__attribute__((target("avx2"))) void widen_bf16_avx2(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i full = _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(full));
  }
  // NOTES: clear the upper halves of the ymm registers before the scalar (SSE-encoded) tail: GCC
  // emits no vzeroupper before a tail call, and SSE code after dirty upper state runs several
  // times slower (every later expf, mulss, ... of the thread; a bf16 step measured 9x slower).
  _mm256_zeroupper();
  widen(src + i, dst + i, n - i);
}
#endif

// widen() with the AVX2 loop where the CPU has it (the block copies are ~20% of a bf16 backward
// with the scalar loop).
inline void widen_run(const bf16* src, float* dst, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return widen_bf16_avx2(src, dst, n);
#endif
  widen(src, dst, n);
}

// Copies rows of a (B, T, nh, d) tensor into / out of a block's stacked rows.
template <typename S>
void gather_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk, const S* src,
                 compute_t<S>* rows) {
  const int64_t run = plan.group * geo.head_dim;
  for (int64_t p = 0; p < blk.positions; ++p) {
    const S* from = src + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group, geo.heads);
    if constexpr (kWidened<S>) {
      widen_run(from, rows + p * run, run);
    } else {
      std::memcpy(rows + p * run, from, static_cast<size_t>(run) * sizeof(S));
    }
  }
}

template <typename S>
void scatter_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk,
                  const compute_t<S>* rows, S* dst) {
  const int64_t run = plan.group * geo.head_dim;
  for (int64_t p = 0; p < blk.positions; ++p) {
    S* to = dst + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group, geo.heads);
    if constexpr (kWidened<S>) {
      narrow(rows + p * run, to, run);
    } else {
      std::memcpy(to, rows + p * run, static_cast<size_t>(run) * sizeof(S));
    }
  }
}

// A key or value block as a GEMM operand: `keys` rows of d, `ld` apart.
template <typename T>
struct KvOperand {
  const T* data;
  int64_t ld;
};

// Rows [s0, s0 + keys) of one kv head (element `offset` is row s0): in place for f32 and f64
// (rows nkv * d apart), widened into `scratch` for bf16 (rows d apart), once per block visit.
template <typename S>
KvOperand<compute_t<S>> kv_operand(const Geometry& geo, const S* src, int64_t offset, int64_t keys,
                                   compute_t<S>* scratch) {
  const int64_t d = geo.head_dim, kv_stride = geo.kv_heads * d;
  if constexpr (kWidened<S>) {
    for (int64_t j = 0; j < keys; ++j) widen_run(src + offset + j * kv_stride, scratch + j * d, d);
    return {scratch, d};
  } else {
    (void)keys, (void)scratch;
    return {src + offset, kv_stride};
  }
}

// Index of row r's entry in lse (B, nh, T).
int64_t lse_index(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk, int64_t r) {
  int64_t head = blk.kv_head * plan.group + r % plan.group;
  return (blk.b * geo.heads + head) * geo.seq + blk.t0 + r / plan.group;
}

// Keys of block [s0, s0 + keys) that row r may attend (causal): 0..keys, clamped.
int64_t visible_keys(const BlockPlan& plan, const QueryBlock& blk, int64_t r, int64_t s0,
                     int64_t keys) {
  int64_t position = blk.t0 + r / plan.group;
  return std::clamp<int64_t>(position - s0 + 1, 0, keys);
}

// Calls f(block) for every query block in the fixed order (b, kv head, t0).
template <typename F>
void for_each_query_block(const Geometry& geo, const BlockPlan& plan, F&& f) {
  for (int64_t b = 0; b < geo.batch; ++b)
    for (int64_t g = 0; g < geo.kv_heads; ++g)
      for (int64_t t0 = 0; t0 < geo.seq; t0 += plan.positions)
        f(QueryBlock{b, g, t0, std::min(plan.positions, geo.seq - t0)});
}

// ---- Forward ------------------------------------------------------------------------------------

template <typename S>
void forward_kernel(const Geometry& geo, const BlockPlan& plan, const S* q, const S* k, const S* v,
                    compute_t<S> scale, S* out, compute_t<S>* lse) {
  using T = compute_t<S>;
  Scratch<T>& s = thread_scratch<T>();
  s.reserve(plan, geo.head_dim, /*backward=*/false, kWidened<S>);
  const int64_t d = geo.head_dim;

  for_each_query_block(geo, plan, [&](const QueryBlock& blk) {
    const int64_t rows = blk.rows(plan);
    gather_rows(geo, plan, blk, q, s.q_rows.data());
    std::fill_n(s.row_max.begin(), rows, -std::numeric_limits<T>::infinity());
    std::fill_n(s.row_sum.begin(), rows, T(0));
    std::fill_n(s.accumulator.begin(), rows * d, T(0));

    for (int64_t s0 = 0; s0 <= blk.last_position(); s0 += plan.keys) {
      const int64_t keys = std::min(plan.keys, blk.last_position() + 1 - s0);
      const int64_t kv_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads);
      const bool on_diagonal = s0 + keys - 1 > blk.t0;  // some row must mask some key
      const KvOperand<T> kb = kv_operand(geo, k, kv_offset, keys, s.k_block.data());
      T* scores = s.scores.data();
      gemm(CblasNoTrans, CblasTrans, rows, keys, d, scale, s.q_rows.data(), d, kb.data, kb.ld, T(0),
           scores, keys);

      for (int64_t r = 0; r < rows; ++r) {
        T* row = scores + r * keys;
        const int64_t visible = on_diagonal ? visible_keys(plan, blk, r, s0, keys) : keys;
        std::fill(row + visible, row + keys, T(0));
        if (visible == 0) continue;
        const T m_old = s.row_max[r];
        const T m_new = std::max(m_old, row_max(row, visible));
        const T rescale = std::exp(m_old - m_new);  // 0 on the first block (m_old = -inf)
        const T block_sum = exp_shift_sum(row, visible, m_new);
        s.row_sum[r] = s.row_sum[r] * rescale + block_sum;
        s.row_max[r] = m_new;
        if (rescale != T(1)) {
          T* acc = s.accumulator.data() + r * d;
          for (int64_t i = 0; i < d; ++i) acc[i] *= rescale;
        }
      }
      const KvOperand<T> vb = kv_operand(geo, v, kv_offset, keys, s.v_block.data());
      gemm(CblasNoTrans, CblasNoTrans, rows, d, keys, T(1), scores, keys, vb.data, vb.ld, T(1),
           s.accumulator.data(), d);
    }

    for (int64_t r = 0; r < rows; ++r) {
      T* acc = s.accumulator.data() + r * d;
      const T l = s.row_sum[r];  // >= 1: the row's maximum contributes exp(0)
      for (int64_t i = 0; i < d; ++i) acc[i] /= l;
      lse[lse_index(geo, plan, blk, r)] = s.row_max[r] + std::log(l);
    }
    scatter_rows(geo, plan, blk, s.accumulator.data(), out);
  });
}

// ---- Backward -----------------------------------------------------------------------------------

// A query block's rows for the backward: q and dout gathered, and per row lse (s.row_sum) and
// D = rowsum(dout * out) (s.row_delta; out is read where it lies, in the gather's row order).
template <typename S>
void load_backward_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk,
                        const S* q, const S* out, const compute_t<S>* lse, const S* dout,
                        Scratch<compute_t<S>>& s) {
  using T = compute_t<S>;
  const int64_t rows = blk.rows(plan), d = geo.head_dim;
  gather_rows(geo, plan, blk, q, s.q_rows.data());
  gather_rows(geo, plan, blk, dout, s.dout_rows.data());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = r / plan.group, hh = r % plan.group;
    const S* out_row =
        out + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group + hh, geo.heads);
    const T* dout_row = s.dout_rows.data() + r * d;
    T delta = 0;
    for (int64_t i = 0; i < d; ++i) delta += dout_row[i] * load(out_row[i]);
    s.row_delta[r] = delta;
    s.row_sum[r] = lse[lse_index(geo, plan, blk, r)];
  }
}

// P = exp(scale * Q K^T - lse) of keys [s0, s0 + keys) into s.scores, 0 past each row's position.
template <typename T>
void backward_probs(const BlockPlan& plan, const QueryBlock& blk, int64_t rows, int64_t s0,
                    int64_t keys, int64_t d, const KvOperand<T>& kb, T scale, Scratch<T>& s) {
  const bool on_diagonal = s0 + keys - 1 > blk.t0;
  T* probs = s.scores.data();
  gemm(CblasNoTrans, CblasTrans, rows, keys, d, scale, s.q_rows.data(), d, kb.data, kb.ld, T(0),
       probs, keys);
  for (int64_t r = 0; r < rows; ++r) {
    T* row = probs + r * keys;
    const int64_t visible = on_diagonal ? visible_keys(plan, blk, r, s0, keys) : keys;
    std::fill(row + visible, row + keys, T(0));
    if (visible > 0) exp_shift_sum(row, visible, s.row_sum[r]);
  }
}

// dP = dout V^T, then dS = P * (dP - D): s.scores turns from P into dS.
template <typename T>
void backward_dscores(int64_t rows, int64_t keys, int64_t d, const KvOperand<T>& vb,
                      Scratch<T>& s) {
  gemm(CblasNoTrans, CblasTrans, rows, keys, d, T(1), s.dout_rows.data(), d, vb.data, vb.ld, T(0),
       s.dprobs.data(), keys);
  for (int64_t r = 0; r < rows; ++r)
    dscores(s.scores.data() + r * keys, s.dprobs.data() + r * keys, keys, s.row_delta[r]);
}

// f32 and f64: one pass over the query blocks; dK and dV sum in dk, dv (GEMMs with beta = 1).
template <typename T>
void backward_kernel(const Geometry& geo, const BlockPlan& plan, const T* q, const T* k, const T* v,
                     const T* out, const T* lse, const T* dout, T scale, T* dq, T* dk, T* dv) {
  Scratch<T>& s = thread_scratch<T>();
  s.reserve(plan, geo.head_dim, /*backward=*/true, /*widened=*/false);
  const int64_t d = geo.head_dim;
  const int64_t kv_stride = geo.kv_heads * d;
  const int64_t kv_numel = geo.batch * geo.seq * geo.kv_heads * d;
  std::fill_n(dk, kv_numel, T(0));
  std::fill_n(dv, kv_numel, T(0));

  for_each_query_block(geo, plan, [&](const QueryBlock& blk) {
    const int64_t rows = blk.rows(plan);
    T* dq_rows = s.accumulator.data();
    load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
    std::fill_n(dq_rows, rows * d, T(0));

    for (int64_t s0 = 0; s0 <= blk.last_position(); s0 += plan.keys) {
      const int64_t keys = std::min(plan.keys, blk.last_position() + 1 - s0);
      const int64_t kv_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads);
      const KvOperand<T> kb{k + kv_offset, kv_stride}, vb{v + kv_offset, kv_stride};
      backward_probs(plan, blk, rows, s0, keys, d, kb, scale, s);
      // dV += P^T dout;  dS = P * (dout V^T - D);  dQ += scale * dS K;  dK += scale * dS^T Q.
      gemm(CblasTrans, CblasNoTrans, keys, d, rows, T(1), s.scores.data(), keys, s.dout_rows.data(),
           d, T(1), dv + kv_offset, kv_stride);
      backward_dscores(rows, keys, d, vb, s);
      gemm(CblasNoTrans, CblasNoTrans, rows, d, keys, scale, s.scores.data(), keys, kb.data, kb.ld,
           T(1), dq_rows, d);
      gemm(CblasTrans, CblasNoTrans, keys, d, rows, scale, s.scores.data(), keys, s.q_rows.data(),
           d, T(1), dk + kv_offset, kv_stride);
    }
    scatter_rows(geo, plan, blk, dq_rows, dq);
  });
}

// bf16 storage: each output element is rounded once, so dK and dV cannot sum across query blocks
// in their bf16 tensors, and an fp32 sum over a whole sequence would grow with T. Two passes
// instead, as the CUDA kernels run (ops/cuda/attention.cu): dQ query block by query block (the
// loop above without the dV and dK products), then dK and dV key block by key block, one key
// block's fp32 sums in scratch, rounded once. Both passes visit every (query block, key block)
// pair of the one-pass loop with its products, sizes and order of accumulation, so each output is
// the f32 kernel's on the widened inputs, rounded once; P and dS are computed twice.
template <typename S>
void backward_kernel_widened(const Geometry& geo, const BlockPlan& plan, const S* q, const S* k,
                             const S* v, const S* out, const compute_t<S>* lse, const S* dout,
                             compute_t<S> scale, S* dq, S* dk, S* dv) {
  using T = compute_t<S>;
  Scratch<T>& s = thread_scratch<T>();
  s.reserve(plan, geo.head_dim, /*backward=*/true, /*widened=*/true);
  const int64_t d = geo.head_dim;
  const int64_t kv_stride = geo.kv_heads * d;

  // Pass 1: dQ += scale * dS K over the key blocks of each query block.
  for_each_query_block(geo, plan, [&](const QueryBlock& blk) {
    const int64_t rows = blk.rows(plan);
    T* dq_rows = s.accumulator.data();
    load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
    std::fill_n(dq_rows, rows * d, T(0));
    for (int64_t s0 = 0; s0 <= blk.last_position(); s0 += plan.keys) {
      const int64_t keys = std::min(plan.keys, blk.last_position() + 1 - s0);
      const int64_t kv_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads);
      const KvOperand<T> kb = kv_operand(geo, k, kv_offset, keys, s.k_block.data());
      const KvOperand<T> vb = kv_operand(geo, v, kv_offset, keys, s.v_block.data());
      backward_probs(plan, blk, rows, s0, keys, d, kb, scale, s);
      backward_dscores(rows, keys, d, vb, s);
      gemm(CblasNoTrans, CblasNoTrans, rows, d, keys, scale, s.scores.data(), keys, kb.data, kb.ld,
           T(1), dq_rows, d);
    }
    scatter_rows(geo, plan, blk, dq_rows, dq);
  });

  // Pass 2: dV += P^T dout and dK += scale * dS^T Q of each key block over the query blocks that
  // see it (last position >= s0), in the one-pass loop's order and with its key counts (its key
  // block stops at the query block's last position).
  T* dk_block = s.dk_block.data();
  T* dv_block = s.dv_block.data();
  for (int64_t b = 0; b < geo.batch; ++b)
    for (int64_t g = 0; g < geo.kv_heads; ++g)
      for (int64_t s0 = 0; s0 < geo.seq; s0 += plan.keys) {
        const int64_t block_keys = std::min(plan.keys, geo.seq - s0);
        const int64_t kv_offset = geo.offset(b, s0, g, geo.kv_heads);
        const KvOperand<T> kb = kv_operand(geo, k, kv_offset, block_keys, s.k_block.data());
        const KvOperand<T> vb = kv_operand(geo, v, kv_offset, block_keys, s.v_block.data());
        std::fill_n(dk_block, block_keys * d, T(0));
        std::fill_n(dv_block, block_keys * d, T(0));
        for (int64_t t0 = s0 / plan.positions * plan.positions; t0 < geo.seq;
             t0 += plan.positions) {
          const QueryBlock blk{b, g, t0, std::min(plan.positions, geo.seq - t0)};
          const int64_t rows = blk.rows(plan);
          const int64_t keys = std::min(block_keys, blk.last_position() + 1 - s0);
          load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
          backward_probs(plan, blk, rows, s0, keys, d, kb, scale, s);
          gemm(CblasTrans, CblasNoTrans, keys, d, rows, T(1), s.scores.data(), keys,
               s.dout_rows.data(), d, T(1), dv_block, d);
          backward_dscores(rows, keys, d, vb, s);
          gemm(CblasTrans, CblasNoTrans, keys, d, rows, scale, s.scores.data(), keys,
               s.q_rows.data(), d, T(1), dk_block, d);
        }
        for (int64_t j = 0; j < block_keys; ++j) {
          narrow(dk_block + j * d, dk + kv_offset + j * kv_stride, d);
          narrow(dv_block + j * d, dv + kv_offset + j * kv_stride, d);
        }
      }
}

// ---- Argument checks ----------------------------------------------------------------------------

void check_same(const Tensor& t, const Shape& shape, DType dtype, const char* op, const char* name,
                const char* layout) {
  if (!t.defined() && shape.numel() > 0)
    MOEPEAK_THROW(op, ": ", name, " ", layout, " is undefined");
  if (t.shape() != shape || t.dtype() != dtype)
    MOEPEAK_THROW(op, ": ", name, " must be ", layout, " = ", dtype_name(dtype), shape.str(),
                  ", got ", t.str());
}

Geometry check_common(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                      double scale, const Tensor& out, const Tensor& lse) {
  if (q.ndim() != 4) MOEPEAK_THROW(op, ": q must be (B, T, nh, d), got ", q.str());
  if (q.dtype() != DType::f32 && q.dtype() != DType::f64 && q.dtype() != DType::bf16)
    MOEPEAK_THROW(op, " supports f32, bf16 and f64, got q ", q.str());
  Geometry geo{q.size(0), q.size(1), q.size(2), k.ndim() == 4 ? k.size(2) : 0, q.size(3)};
  if (k.ndim() != 4 || k.size(0) != geo.batch || k.size(1) != geo.seq ||
      k.size(3) != geo.head_dim || geo.kv_heads < 1)
    MOEPEAK_THROW(op, ": k must be (B, T, nkv, d) with B, T, d of q ", q.str(), ", got ", k.str());
  if (geo.heads < 1 || geo.head_dim < 1 || geo.heads % geo.kv_heads != 0)
    MOEPEAK_THROW(op, ": query heads nh = ", geo.heads, " must be a positive multiple of kv heads",
                  " nkv = ", geo.kv_heads, " and d = ", geo.head_dim, " positive (q ", q.str(),
                  ", k ", k.str(), ")");
  if (geo.heads * geo.head_dim > INT_MAX / 4 || geo.seq > INT_MAX)
    MOEPEAK_THROW(op, ": q ", q.str(), " exceeds the 32-bit GEMM dimensions");
  if (!std::isfinite(scale) || scale <= 0)
    MOEPEAK_THROW(op, ": scale must be finite and positive, got ", scale);
  const Shape kv_shape = k.shape();
  check_same(q, q.shape(), q.dtype(), op, "q", "(B, T, nh, d)");
  check_same(k, kv_shape, q.dtype(), op, "k", "(B, T, nkv, d)");
  check_same(v, kv_shape, q.dtype(), op, "v", "(B, T, nkv, d)");
  check_same(out, q.shape(), q.dtype(), op, "out", "(B, T, nh, d)");
  check_same(lse, Shape{geo.batch, geo.heads, geo.seq}, attention_lse_dtype(q.dtype()), op, "lse",
             "(B, nh, T)");
  return geo;
}

void check_blocks(const char* op, AttentionBlocks blocks) {
  if (blocks.query_rows < 1 || blocks.keys < 1)
    MOEPEAK_THROW(op, ": block sizes must be positive, got ", blocks.query_rows, " query rows x ",
                  blocks.keys, " keys");
}

}  // namespace

void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                  const Tensor& out, const Tensor& lse) {
  check_common("attention_forward", q, k, v, scale, out, lse);
}

void check_attention_backward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout,
                                   double scale, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv) {
  const char* op = "attention_backward";
  check_common(op, q, k, v, scale, out, lse);
  check_same(dout, q.shape(), q.dtype(), op, "dout", "(B, T, nh, d)");
  check_same(dq, q.shape(), q.dtype(), op, "dq", "(B, T, nh, d)");
  check_same(dk, k.shape(), q.dtype(), op, "dk", "(B, T, nkv, d)");
  check_same(dv, k.shape(), q.dtype(), op, "dv", "(B, T, nkv, d)");
}

namespace detail {

void attention_forward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                   const Tensor& out, const Tensor& lse, AttentionBlocks blocks,
                                   Stream& stream) {
  const char* op = "attention_forward";
  const Geometry geo = check_common(op, q, k, v, scale, out, lse);
  check_blocks(op, blocks);
  CpuStream& cpu = as_cpu_stream(stream);
  if (q.numel() == 0) return;
  const BlockPlan plan = plan_blocks(geo, blocks);
  dispatch_storage(q.dtype(), op, [&](auto zero) {
    using S = decltype(zero);
    using T = compute_t<S>;  // also lse's dtype (attention_lse_dtype)
    const S* qp = q.data_as<S>();
    const S* kp = k.data_as<S>();
    const S* vp = v.data_as<S>();
    S* outp = out.data_as<S>();
    T* lsep = lse.data_as<T>();
    const T scale_t = static_cast<T>(scale);
    cpu.enqueue([=] { forward_kernel<S>(geo, plan, qp, kp, vp, scale_t, outp, lsep); });
  });
}

void attention_backward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    double scale, const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv, AttentionBlocks blocks, Stream& stream) {
  const char* op = "attention_backward";
  check_attention_backward_args(q, k, v, out, lse, dout, scale, dq, dk, dv);
  check_blocks(op, blocks);
  CpuStream& cpu = as_cpu_stream(stream);
  if (q.numel() == 0) return;
  const Geometry geo{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  const BlockPlan plan = plan_blocks(geo, blocks);
  dispatch_storage(q.dtype(), op, [&](auto zero) {
    using S = decltype(zero);
    using T = compute_t<S>;
    const S* qp = q.data_as<S>();
    const S* kp = k.data_as<S>();
    const S* vp = v.data_as<S>();
    const S* outp = out.data_as<S>();
    const T* lsep = lse.data_as<T>();
    const S* doutp = dout.data_as<S>();
    S* dqp = dq.data_as<S>();
    S* dkp = dk.data_as<S>();
    S* dvp = dv.data_as<S>();
    const T scale_t = static_cast<T>(scale);
    cpu.enqueue([=] {
      if constexpr (kWidened<S>) {
        backward_kernel_widened<S>(geo, plan, qp, kp, vp, outp, lsep, doutp, scale_t, dqp, dkp,
                                   dvp);
      } else {
        backward_kernel<S>(geo, plan, qp, kp, vp, outp, lsep, doutp, scale_t, dqp, dkp, dvp);
      }
    });
  });
}

}  // namespace detail

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           const Tensor& out, const Tensor& lse, Stream& stream) {
  detail::attention_forward_cpu_blocked(q, k, v, scale, out, lse, kAttentionBlocks, stream);
}

void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, Stream& stream) {
  detail::attention_backward_cpu_blocked(q, k, v, out, lse, dout, scale, dq, dk, dv,
                                         kAttentionBlocks, stream);
}

const char* attention_kernels(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out) {
  if (!runs_on_cuda(out)) return "cpu: OpenBLAS blocks";
#ifdef MOEPEAK_WITH_CUDA
  return attention_kernels_cuda(q, k, v, out);
#else
  (void)q, (void)k, (void)v;
  throw_no_cuda("attention_kernels");
#endif
}

}  // namespace moepeak::ops
