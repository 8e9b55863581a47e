// attention: causal grouped-query self-attention (transformers' Mixtral, Qwen3-MoE, LLaMA),
// flash-style forward and backward. Query head h reads kv head h / (nh / nkv); query t attends keys
// s <= t of its own sequence; scores are scaled by `scale` (1/sqrt(d) in the model, passed
// explicitly).
//
//   q:    (B, T, nh, d)   f32 | bf16 | f64 (one dtype for every tensor of a call but lse; on
//                         CUDA d <= 256)
//   k, v: (B, T, nkv, d)  nh % nkv == 0
//   out:  (B, T, nh, d)   out = softmax(scale * q k^T, causal) v, written (=)
//   lse:  (B, nh, T)      in attention_lse_dtype(q): q's dtype, f32 for bf16 q;
//                         log-sum-exp of each query row's scaled scores, written (=); saved for
//                         the backward, which recomputes the probabilities from it
//   dout: (B, T, nh, d)
//   dq:   (B, T, nh, d)   written (=)
//   dk:   (B, T, nkv, d)  written (=); a kv head sums the contributions of all its query heads
//   dv:   (B, T, nkv, d)  written (=)
//
// No T x T matrix exists anywhere: the forward runs an online softmax over key blocks (running
// max, running sum, rescaled accumulator) and the backward recomputes each block's probabilities
// from q, k and the saved lse. Scratch is a thread-local block of queries and of scores, of size
// O(block_rows * (block_keys + d)), plus O(block_keys * d) of widened keys and values with bf16
// storage — the "shared memory" of a GPU kernel.
//
// A query block stacks the nh/nkv query heads of one kv head over a run of positions, so each
// key/value block is read once for the whole group and the GEMMs have block_rows rows whatever
// the grouping. Block products are OpenBLAS GEMMs that stride over the (T, heads, d) layout.
//
// Threading: the loops run single-threaded on the stream's worker and let OpenBLAS thread each
// GEMM (its own pool, sized by OPENBLAS_NUM_THREADS); adding threads of our own on top would
// oversubscribe the cores. Every reduction has a fixed order, so results are bitwise
// reproducible run to run (with a fixed OpenBLAS thread count).
//
// CPU, bf16 storage (ops/cpu/attention.cpp): the CPU f32 algorithm with bf16 loads and stores.
// Query rows are widened to fp32 as a block is gathered and each key/value block into scratch
// once per visit; every product, the softmax and its gradient are the f32 path's fp32 arithmetic
// (P and dS stay fp32); each element of out, dq, dk and dv is rounded to bf16 once (nearest
// even), and lse is f32. So a bf16 result is bitwise the CPU f32 result on the widened inputs
// (the backward's: q, k, v, dout and out widened, lse as is), rounded once
// (tests/ops/test_attention.cpp). As a bf16 dk/dv cannot sum across query blocks in its own
// tensor, and an fp32 sum over the sequence would grow with T, the bf16 backward runs two passes
// as CUDA does: dq by query blocks, then dk/dv by key blocks with one key block's fp32 sums in
// scratch (P and dS computed twice: 7 block GEMMs instead of 5). Against CUDA: the tensor-core
// path below rounds P and dS to bf16 before its products (l sums the rounded P), the CPU does not
// (as CUDA's SIMT path does not), and the sums run in other orders, so the two agree to bf16
// rounding (test_backend_ops), not bitwise.
// CUDA, bf16 with d = 32, 64 or 128 (ops/cuda/attention_tc.cu): tensor-core kernels, 64-row
// blocks of 4 warps streaming 64-entry tiles; Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q are bf16
// WMMA products with fp32 accumulation, the softmax and its gradient fp32 (P and dS rounded to
// bf16 as the products' inputs; l sums the rounded P). Same layout, recomputation and ownership
// as below, no atomics, bitwise reproducible.
// CUDA, everything else (ops/cuda/attention.cu): SIMT kernels (no tensor cores), fp32 math on f32
// and bf16 storage, f64 on f64; any head dim up to 256 (multiple of 32 or not); no device memory
// of their own. The query
// rows of kv head g are flattened as row = t * G + hh, so a block mixes the group's heads and reads
// each K/V tile once for all of them. A block is 4 warps; it owns 16 query rows (forward, dq) or
// 16 keys (dk, dv), 4 per warp, and streams the other operand through shared memory in tiles of
// 32, one entry per lane: a lane takes the d-long dot products of its entry with the warp's rows
// (shared-memory broadcasts; lane-indexed tiles have an odd row stride, d | 1, against bank
// conflicts), scores are reduced across the warp with shuffles, and the d-wide accumulators are
// spread over the lanes (column lane + 32 i). The forward keeps the online softmax per row. The
// backward is two kernels, dq (rows streaming key tiles) and dk/dv (keys streaming tiles of query
// rows of all G heads); both recompute p = exp(scale q.k - lse) and D = dout . out per row instead
// of keeping scratch. Each output row belongs to one block, so dk and dv are written (=) without
// atomics, and every sum has a fixed order: results are bitwise reproducible.
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

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           const Tensor& out, const Tensor& lse, Stream& stream);
void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, Stream& stream);

// Throw moepeak::Error naming the op and the shapes unless the arguments fit the table above.
void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                  const Tensor& out, const Tensor& lse);
void check_attention_backward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout,
                                   double scale, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv);

namespace detail {
// The same ops with other block sizes: tests use small blocks so that short sequences cross many
// blocks. Production code calls the entry points above (kAttentionBlocks).
void attention_forward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                   const Tensor& out, const Tensor& lse, AttentionBlocks blocks,
                                   Stream& stream);
void attention_backward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    double scale, const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv, AttentionBlocks blocks, Stream& stream);
}  // namespace detail

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const Tensor& out, const Tensor& lse, Stream& stream);
void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv, Stream& stream);
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              const Tensor& out, const Tensor& lse, Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(attention_forward, out, q, k, v, scale, out, lse, stream);
}
// The kernels a call with these tensors runs, in words (benches print it): "cpu: OpenBLAS
// blocks", "cuda: tensor cores (bf16 WMMA)" or "cuda: SIMT".
const char* attention_kernels_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out);
const char* attention_kernels(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out);  // ops/cpu/attention.cpp
inline void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, double scale,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(attention_backward, dq, q, k, v, out, lse, dout, scale, dq, dk, dv, stream);
}

}  // namespace moepeak::ops
