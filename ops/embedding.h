// embedding: token embedding lookup (model.embed_tokens) and its weight gradient.
//
//   ids:     (N)    i64, token ids in [0, V)
//   weight:  (V, H) f32 | bf16 | f64 (both backends)
//   out:     (N, H) same dtype as weight             out[n] = weight[ids[n]]      (written, =)
//   dout:    (N, H)
//   dweight: (V, H) dout's dtype, or f32 when dout is bf16 (the fp32 main gradient), on both
//                   backends
//                                                    dweight[ids[n]] += dout[n]   (accumulated, +=)
//
// The backward adds rows in increasing n, so a weight row hit by several tokens sums them in a
// fixed order and results are bitwise reproducible. Each += is done in the compute type (fp32
// for f32 and bf16, double for f64) and stored in dweight's dtype: with bf16 storage every
// addition rounds to bf16 (on both backends, so CPU and CUDA agree bitwise); with an f32
// dweight for bf16 dout (both backends) the additions are the f32 ones on the bf16 values, no
// bf16 rounding, so CPU and CUDA agree bitwise there too. The forward copies elements unchanged
// (bitwise, any of the three dtypes).
//
// Id range: ids are often produced on a stream (a copy from pinned memory), so the stream task
// checks every id before it is used and throws a moepeak::Error naming the position and the id;
// the error is sticky and surfaces at the stream's synchronize(). Callers whose ids are already
// readable on the host (the data loader, or after a synchronize) can also check them at once with
// embedding_check_ids_host().
//
// CUDA (ops/cuda/embedding.cu): the forward is a block per token. The backward is deterministic
// without atomics and in the CPU's order: each block owns a range of weight rows, scans the ids
// in increasing n and adds the dout rows that fall in its range one after another, each column
// by one thread, so every dweight element receives its tokens' additions in increasing n (with
// f32 storage bitwise the CPU's f32 result; with bf16 storage each += rounds to bf16; with an f32
// dweight of bf16 dout each += is in fp32, bitwise the CPU's). Every block reads all N ids (from
// L2); a row hit by many tokens is added serially by its block.
// Ids are not checked on the GPU (an error would need a host sync) and nothing throws: the
// forward writes NaN to out[n] for an id outside [0, V) (so the loss goes NaN and the training's
// non-finite guard stops the run), the backward skips such a token (adds nothing for it).
// Check ids on the host with embedding_check_ids_host() where an error is wanted.
// Test: tests/ops/test_vocab_ops.cpp (CPU), tests/ops/test_moe_ops.cpp (Bf16Storage: the CPU's
// bf16 and f32-dweight paths), tests/ops/backend_ops/cases_embedding.cpp (each backend against
// the f64 CPU reference, and the invalid-id behaviour on CUDA).
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void embedding_forward_cpu(const Tensor& ids, const Tensor& weight, const Tensor& out,
                           Stream& stream);
void embedding_backward_cpu(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                            Stream& stream);

// The shape and dtype checks both backends run at the call (throw moepeak::Error naming `op`).
void check_embedding_forward_args(const char* op, const Tensor& ids, const Tensor& weight,
                                  const Tensor& out);
// dweight has dout's dtype, or f32 when dout is bf16 (the fp32 main gradient).
void check_embedding_backward_args(const char* op, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dweight);

// Synchronous check on the caller's thread: throws naming the first position whose id is outside
// [0, vocab_size). Reads the ids now, so they must be ready (no pending stream writes).
void embedding_check_ids_host(const Tensor& ids, int64_t vocab_size);

// The same ops on the GPU (ops/cuda/), and the entry points callers use: each runs on the
// backend of its output's memory (MOEPEAK_OP_ON_BACKEND, ops/op_common.h).
void embedding_forward_cuda(const Tensor& ids, const Tensor& weight, const Tensor& out,
                            Stream& stream);
void embedding_backward_cuda(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                             Stream& stream);
inline void embedding_forward(const Tensor& ids, const Tensor& weight, const Tensor& out,
                              Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(embedding_forward, out, ids, weight, out, stream);
}
inline void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                               Stream& stream) {
  MOEPEAK_OP_ON_BACKEND(embedding_backward, dweight, ids, dout, dweight, stream);
}

}  // namespace moepeak::ops
