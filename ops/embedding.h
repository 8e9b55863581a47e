// embedding: token embedding lookup (model.embed_tokens) and its weight gradient.
//
//   ids:     (N)    i64, token ids in [0, V)
//   weight:  (V, H) f32 | f64
//   out:     (N, H) same dtype as weight             out[n] = weight[ids[n]]      (written, =)
//   dout:    (N, H)
//   dweight: (V, H)                                  dweight[ids[n]] += dout[n]   (accumulated, +=)
//
// The backward adds rows in increasing n, so a weight row hit by several tokens sums them in a
// fixed order and results are bitwise reproducible.
//
// Id range: ids are often produced on a stream (a copy from pinned memory), so the stream task
// checks every id before it is used and throws a moepeak::Error naming the position and the id;
// the error is sticky and surfaces at the stream's synchronize(). Callers whose ids are already
// readable on the host (the data loader, or after a synchronize) can also check them at once with
// embedding_check_ids_host().
#pragma once

#include <cstdint>

#include "core/runtime/stream.h"
#include "ops/op_common.h"

namespace moepeak::ops {

void embedding_forward_cpu(const Tensor& ids, const Tensor& weight, const Tensor& out,
                           Stream& stream);
void embedding_backward_cpu(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                            Stream& stream);

// Synchronous check on the caller's thread: throws naming the first position whose id is outside
// [0, vocab_size). Reads the ids now, so they must be ready (no pending stream writes).
void embedding_check_ids_host(const Tensor& ids, int64_t vocab_size);

}  // namespace moepeak::ops
