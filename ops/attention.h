// attention: causal grouped-query self-attention (transformers' Mixtral, Qwen3-MoE, LLaMA,
// gpt-oss), flash-style forward and backward. Query head h reads kv head h / (nh / nkv); query t
// attends keys s <= t of its own sequence; scores are scaled by `scale` (1/sqrt(dqk) in the model,
// passed explicitly). Queries and keys have head dim dqk, values (and so the output) dv, which may
// differ (DeepSeek-V3's multi-head latent attention: dqk = 128 + 64 = 192, dv = 128); both are
// read from the shapes. An AttentionVariant adds, per call:
//   window W > 0   query t sees only keys t - W < s <= t: itself and the W - 1 keys before it
//                  (transformers' sliding_window_overlay, kv_idx > q_idx - W); key blocks wholly
//                  outside every row's window are skipped, so a call costs O(T * W), not O(T^2)
//   sinks  (nh)    a learned logit per query head (gpt-oss's self_attn.sinks): each row's softmax
//                  runs over its scores and sinks[h], and the sink's column is dropped (it has no
//                  value), i.e. out = sum_s p_s v_s with p_s = exp(scale q.k_s - lse) and
//                  lse = log(exp(sinks[h]) + sum_s exp(scale q.k_s))
//   doc_start (B, T) packed documents (Megatron's reset_attention_mask, transformers' varlen
//                  flash attention, torchtitan's document masks): doc_start[b][t] is the first
//                  position of the document query t of sequence b belongs to, and the query sees
//                  only keys of it: max(doc_start[b][t], t - W + 1 with a window, else 0) <= s
//                  <= t (sinks join every row's softmax as above); key blocks wholly before
//                  every row's document are skipped, so a window of documents of lengths L_i
//                  costs O(sum_i L_i^2) (plus a block per query block), not O(T^2)
//
//   q:      (B, T, nh, dqk)   f32 | bf16 | f64 (one dtype for every tensor of a call but lse and
//                             dsinks; on CUDA dqk <= 256 and dv <= 256)
//   k:      (B, T, nkv, dqk)  nh % nkv == 0
//   v:      (B, T, nkv, dv)   dv >= 1, independent of dqk
//   sinks:  (nh)              q's dtype; undefined Tensor(): no sinks
//   doc_start: (B, T) i32     on out's backend (CUDA device memory for a CUDA call, CPU memory
//                             else); undefined Tensor(): one document per sequence. The caller's
//                             contract: 0 <= doc_start[b][t] <= t, non-decreasing in t within a
//                             sequence (so doc_start[b][0] = 0, and a document is a run of equal
//                             values); the checks below test dtype, shape and backend only. The
//                             CPU kernels test the values as they run (a violation throws
//                             moepeak::Error at the stream's synchronize); CUDA does not test
//                             them: there a violation gives meaningless values (a row that sees
//                             no key: NaN) but no read outside the tensors
//   out:    (B, T, nh, dv)    out = softmax(scale * q k^T, causal, window, documents, sink) v,
//                             written (=)
//   lse:    (B, nh, T)        in attention_lse_dtype(q): q's dtype, f32 for bf16 q;
//                             log-sum-exp of each query row's scaled scores (and its sink),
//                             written (=); saved for the backward, which recomputes the
//                             probabilities from it
//   dout:   (B, T, nh, dv)
//   dq:     (B, T, nh, dqk)   written (=)
//   dk:     (B, T, nkv, dqk)  written (=); a kv head sums the contributions of all its query heads
//   dv:     (B, T, nkv, dv)   written (=)
//   dsinks: (nh)              accumulated (+=): dsinks[h] += -sum_{b,t} exp(sinks[h] -
//                             lse[b,h,t]) * D[b,t,h], D = dout . out over dv (the sink's
//                             probability times the usual softmax-gradient row term); q's dtype,
//                             or f32 when q is bf16 (the fp32 main gradient); undefined Tensor()
//                             skips it (and must be undefined without sinks). The sum runs in
//                             double in (b, t) order and is added once, so it is bitwise
//                             reproducible.
// With sinks the forward's lse already includes exp(sinks[h]) and out is normalised by it, so the
// backward's dq, dk, dv are the plain flash backward on (out, lse): the sink only adds dsinks.
// Under Ulysses a rank passes the slice of sinks (and dsinks) of the query heads it holds.
//
// No T x T matrix exists anywhere: the forward runs an online softmax over key blocks (running
// max, running sum, rescaled accumulator) and the backward recomputes each block's probabilities
// from q, k and the saved lse. Scratch is a thread-local block of queries and of scores, of size
// O(block_rows * (block_keys + dqk + dv)), plus O(block_keys * (dqk + dv)) of widened keys and
// values with bf16 storage — the "shared memory" of a GPU kernel.
//
// A query block stacks the nh/nkv query heads of one kv head over a run of positions, so each
// key/value block is read once for the whole group and the GEMMs have block_rows rows whatever
// the grouping. Block products are OpenBLAS GEMMs that stride over the (T, heads, dqk or dv)
// layouts: Q K^T, dS K and dS^T Q run over dqk, P V, dout V^T and P^T dout over dv.
//
// Threading: the loops run single-threaded on the stream's worker and let OpenBLAS thread each
// GEMM (its own pool, sized by OPENBLAS_NUM_THREADS); adding threads of our own on top would
// oversubscribe the cores. Every reduction has a fixed order, so results are bitwise
// reproducible run to run (with a fixed OpenBLAS thread count).
//
// CPU (ops/cpu/attention_forward.cpp, attention_backward.cpp; shared parts in
// attention_common.h), window and sinks: keys are cut into key blocks at multiples of
// block_keys from 0, and a query block visits those from the one holding its first row's first
// key, max(0, t0 - W + 1), to the one holding its last position (cut there); keys of a visited
// block outside a row's window are exact zeros of P. A call thus computes at most
// B nh T (P + W + block_keys) scores (P positions per query block), O(T W), and a key outside a
// row's window never touches the row's bits; W >= T and W = 0 run the same loop. The sink is
// folded into each row after its last key block, as one more column without a value:
// m' = max(m, s), l' = l exp(m - m') + exp(s - m'), acc scaled by exp(m - m'); a sink so far
// below the row's max that exp(s - m) = 0 leaves every bit as without sinks. dsinks is a pass of
// its own after dq, dk, dv: head by head, D = dout . out recomputed in double. Without a window
// or sinks the loops, products and their order are those of plain causal attention, so its
// results are bitwise what they were. (Key blocks stay on the multiples of block_keys for a
// window rather than starting at each query block's window: the bf16 backward's key-block pass
// must cut the keys as the one-pass loop does, as OpenBLAS's value for an element depends on the
// other rows and columns of its call.)
// CPU, documents: a row's first key is max(doc_start, its window's first key), and a query
// block's first key block the one holding its first row's first key (doc_start is
// non-decreasing, so no later row sees an earlier key). The keys from there to the block's last
// position are each seen by some row of the block (every row sees its own position, and a row's
// keys run up to it), so no visited (query block, key block) pair is wholly masked: a call
// computes at most B nh sum over query blocks of rows x (P + the longest document or window
// reaching into the block + block_keys) scores, about sum_i L_i^2 + T (P + block_keys) per
// head for documents of lengths L_i. Keys before a row's document are exact zeros of P, like
// those outside its window, and never touch the row's bits. doc_start all zeros is bitwise
// doc_start undefined (the same blocks, spans and order). The kernels test doc_start's
// contract (0 <= doc_start[b][t] <= t, non-decreasing) before they run.
//
// CPU, bf16 storage: the CPU f32 algorithm with bf16 loads and stores (sinks widened to fp32).
// Query rows are widened to fp32 as a block is gathered and each key/value block into scratch
// once per visit; every product, the softmax and its gradient are the f32 path's fp32 arithmetic
// (P and dS stay fp32); each element of out, dq, dk and dv is rounded to bf16 once (nearest
// even), and lse is f32. So a bf16 result is bitwise the CPU f32 result on the widened inputs
// (the backward's: q, k, v, dout and out widened, lse as is), rounded once, and its lse and
// dsinks (f32) are the f32 run's bitwise (tests/ops/test_attention.cpp,
// test_attention_variants.cpp). As a bf16 dk/dv cannot sum across query blocks in its own
// tensor, and an fp32 sum over the sequence would grow with T, the bf16 backward runs two passes
// as CUDA does: dq by query blocks, then dk/dv by key blocks with one key block's fp32 sums in
// scratch (P and dS computed twice: 7 block GEMMs instead of 5). Against CUDA: the tensor-core
// path below rounds P and dS to bf16 before its products (l sums the rounded P), the CPU does not
// (as CUDA's SIMT path does not), and the sums run in other orders, so the two agree to bf16
// rounding (test_backend_ops), not bitwise.
// CUDA, bf16 with dqk and dv each 32, 64, 128, 192 or 256 and shared memory within sm_90's
// 227 KiB per block, which holds dqk + dv <= 320 (DeepSeek's 192 / 128 included, 256 / 256 not;
// ops/cuda/attention_tc.cu): tensor-core kernels, 64-row blocks of 4 warps streaming 64-entry
// tiles; Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q are bf16 WMMA products with fp32
// accumulation, the softmax and its gradient fp32 (P and dS rounded to bf16 as the products'
// inputs; l sums the rounded P). Same layout, recomputation and ownership as below, no atomics,
// bitwise reproducible.
// CUDA, everything else (ops/cuda/attention.cu): SIMT kernels (no tensor cores), fp32 math on f32
// and bf16 storage, f64 on f64; any dqk and dv up to 256 (multiples of 32 or not); no device
// memory of their own. The query rows of kv head g are flattened as row = t * G + hh, so a block
// mixes the group's heads and reads each K/V tile once for all of them. A block is 4 warps; it
// owns 16 query rows (forward, dq) or 16 keys (dk, dv), 4 per warp, and streams the other
// operand through shared memory in tiles of 32, one entry per lane: a lane takes the dot
// products of its entry with the warp's rows (q.k over dqk, dout.v over dv; shared-memory
// broadcasts; lane-indexed tiles have an odd row stride, d | 1, against bank conflicts), scores
// are reduced across the warp with shuffles, and the accumulators (dv wide for out and dv, dqk
// wide for dq and dk) are spread over the lanes (column lane + 32 i). The forward keeps the online
// softmax per row. The
// backward is two kernels, dq (rows streaming key tiles) and dk/dv (keys streaming tiles of query
// rows of all G heads); both recompute p = exp(scale q.k - lse) and D = dout . out per row instead
// of keeping scratch. Each output row belongs to one block, so dk and dv are written (=) without
// atomics, and every sum has a fixed order: results are bitwise reproducible.
// CUDA, window and sinks (both paths): a window W >= T runs as plain causal attention, and W = 0
// without sinks is bitwise the plain kernels. The forward and dq kernels start their key loop at
// the block's first position - W + 1, and the dk/dv kernels end their loop over query rows at the
// rows of the last position that sees the block's last key, so tiles wholly outside every row's
// window are never loaded (O(T W)); tiles the window cuts are masked per element (p = 0 exactly).
// The sink is folded into each row once, after the online softmax: m' = max(m, sinks[h]),
// l' = l exp(m - m') + exp(sinks[h] - m'), out = acc exp(m - m') / l', lse = m' + log l' (in the
// compute type; on the tensor cores in fp32, not rounded to bf16: it is in no product). The
// backward's dq, dk and dv kernels are the plain ones on (out, lse); dsinks is one more small
// kernel (ops/cuda/attention_sinks.cu, both paths), a block per query head: D = dout . out and
// exp(sinks[h] - lse) D in double, warps over (b, t) rows in a fixed order, a fixed-order block
// reduction, and thread 0 adds the total once (no atomics): bitwise reproducible.
// CUDA, documents (both paths; helpers in ops/cuda/attention_documents.cuh): a row's first key is
// max(doc_start, its window's first key). The forward and dq kernels start their key loop at the
// block's first row's first key (doc_start is non-decreasing), and the dk/dv kernels end their
// loop over query rows, and each key its rows, at the first position whose document starts after
// the key (a binary search over doc_start, O(log T) loads per key), so tiles before every row's
// document, or after every row that sees the block's keys, are never loaded: a window of
// documents of lengths L_i costs O(sum_i L_i^2) plus a tile per block. Keys a row's document
// cuts from a loaded tile are masked per element (p = 0 exactly). Without doc_start the kernels
// run exactly the arithmetic they did.
#pragma once

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

// The dtype of lse for a given q: the compute dtype (f32 for bf16 storage, so the backward
// recomputes the probabilities from an fp32 log-sum-exp as FlashAttention does).
constexpr DType attention_lse_dtype(DType q) { return q == DType::bf16 ? DType::f32 : q; }

// Rows of a query block (positions x query heads of one kv head) and keys of a key block. With
// d = 64 a block's GEMMs are 256 x 256 x 64, large enough for OpenBLAS to thread them well, and the
// scratch (~0.6 MiB in the backward) stays in a core's L2.
struct AttentionBlocks {
  int query_rows = 256;
  int keys = 256;
};
inline constexpr AttentionBlocks kAttentionBlocks{};

// What a call adds to the causal mask (see the table above). The default is plain causal
// attention.
struct AttentionVariant {
  int64_t window = 0;  // 0: every key s <= t; W > 0: keys t - W < s <= t
  Tensor sinks;        // (nh) in q's dtype, or undefined: no sinks
  // (B, T) i32 on out's backend, or undefined: one document per sequence. Query t of sequence b
  // sees only keys s >= doc_start[b][t] (0 <= doc_start[b][t] <= t, non-decreasing in t).
  Tensor doc_start{};
};

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           const AttentionVariant& variant, const Tensor& out, const Tensor& lse,
                           Stream& stream);
void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, double scale,
                            const AttentionVariant& variant, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dsinks, Stream& stream);

// Throw moepeak::Error naming the op and the shapes unless the arguments fit the table above.
// (A negative window, sinks of another length or dtype, dsinks without sinks or of the wrong
// dtype, a doc_start of another shape, dtype or backend are errors too; doc_start's values are
// not read here.)
void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                  const AttentionVariant& variant, const Tensor& out,
                                  const Tensor& lse);
void check_attention_backward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout,
                                   double scale, const AttentionVariant& variant, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const Tensor& dsinks);

namespace detail {
// The same ops with other block sizes: tests use small blocks so that short sequences cross many
// blocks. Production code calls the entry points above (kAttentionBlocks).
void attention_forward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                   const AttentionVariant& variant, const Tensor& out,
                                   const Tensor& lse, AttentionBlocks blocks, Stream& stream);
void attention_backward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    double scale, const AttentionVariant& variant, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv, const Tensor& dsinks,
                                    AttentionBlocks blocks, Stream& stream);
// Score entries (query rows x keys of each block product Q K^T) the CPU kernels have computed
// since the process started, forward and backward, counted as they are enqueued work runs: tests
// check that a windowed call visits only the key blocks its windows reach (O(T * W)), and a call
// with documents only those its documents reach.
int64_t attention_cpu_scores_computed();
}  // namespace detail

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const AttentionVariant& variant, const Tensor& out, const Tensor& lse,
                            Stream& stream);
void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, double scale,
                             const AttentionVariant& variant, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dsinks, Stream& stream);
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              const AttentionVariant& variant, const Tensor& out, const Tensor& lse,
                              Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(attention_forward, out, q, k, v, scale, variant, out, lse, stream);
}
inline void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, double scale,
                               const AttentionVariant& variant, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv, const Tensor& dsinks, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(attention_backward, dq, q, k, v, out, lse, dout, scale, variant, dq, dk, dv,
                        dsinks, stream);
}
// Plain causal attention (no window, no sinks, one document per sequence).
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              const Tensor& out, const Tensor& lse, Stream& stream) {
  attention_forward(q, k, v, scale, AttentionVariant{}, out, lse, stream);
}
inline void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, double scale,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               Stream& stream) {
  attention_backward(q, k, v, out, lse, dout, scale, AttentionVariant{}, dq, dk, dv, Tensor(),
                     stream);
}
// The kernels a call with these tensors runs, in words (benches print it): "cpu: OpenBLAS
// blocks", "cuda: tensor cores (bf16 WMMA)" or "cuda: SIMT".
const char* attention_kernels_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out);
const char* attention_kernels(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out);  // ops/cpu/attention.cpp

}  // namespace moepeak::ops
