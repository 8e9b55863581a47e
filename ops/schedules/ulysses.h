// Sequence-parallel (Ulysses) head exchange for attention (docs/design.md#parallel-layout): the
// all-to-alls that turn a rank's token slice of every head into whole sequences of its own heads,
// and back.
//
// Each of the W ranks owns positions [r*T/W, (r+1)*T/W) of every sequence b (global positions,
// so RoPE is applied before the exchange with the true position). Around attention:
//
//   sequence layout  x_seq   (B, T/W, h_total, d)   this rank's tokens, every head
//   head layout      x_heads (B, T, h_r, d)         whole sequences, this rank's heads
//
// Query heads of rank p: [p*nh/W, (p+1)*nh/W). Query head h reads kv head h / (nh/nkv), so rank p
// needs kv heads [first_q/g, last_q/g]: nkv/W of them when nkv >= W; when nkv < W one kv head is
// needed by W/nkv ranks and is sent to each of them (replication, as gpt-oss's 8 kv heads on 16+
// ranks need). In the head layout the rank's query and kv heads form a valid grouped-query
// attention of their own (local query head i reads local kv head i / (h_q / h_kv)), so
// ops::attention_*_cpu runs on them unchanged; the lse (B, h_q, T) stays in the head layout.
//
// Accepted configurations (UlyssesLayout::make, before any work; the message names the numbers):
// T % W == 0, nh % W == 0, nh % nkv == 0, and nkv % W == 0 or W % nkv == 0 (otherwise a rank's
// query heads would straddle kv heads unevenly and its heads would not form a grouped-query
// attention the op can run).
//
// Staging: the exchange packs into and unpacks from one caller-provided staging Tensor (1-D, the
// tensors' dtype, at least ulysses_staging_elements(layout, kind) elements): [send | receive].
// It grows with N = B*T/W, so it is a Tensor argument, never allocated here;
// make_ulysses_staging() takes one from the backend's arena under LiveSet::attention, sized for
// every exchange of a layer (q, k, v, out forward; dout, dq, dk, dv backward), which run one
// after another on one stream and reuse it.
//
// Stream order, on either backend: pack (one ops::copy_2d per peer: a column block of the
// (tokens, heads * d) rows), comm.all_to_all_v on the same stream (MPI on the CPU, NCCL on CUDA),
// unpack (ops::copy_2d per peer; the summing unpack adds the copies with ops::add first).
// Asynchronous like an op: arguments are checked on the caller's thread; tensors and staging must
// stay alive until the stream has passed the call. Copies work for any dtype Comm carries (f32,
// f64, bf16, i32, i64); the summing unpack (heads_to_seq with accumulate) takes what ops::add
// takes (f32 and f64 on the CPU; f32 and bf16 on CUDA).
//
// Test: ctest -R ulysses --output-on-failure   (2 and 4 ranks under mpirun)
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

namespace moepeak::schedules {

// Which heads a tensor carries: query heads (q, out, dout, dq) or kv heads (k, v, dk, dv).
enum class HeadKind { query, kv };

// The accepted-configuration rule (header comment) a layout breaks, in the order they are tested:
// query_heads nh % W, seq_len T % W, kv_group nh % nkv, kv_heads nkv and W dividing neither.
enum class UlyssesDefect { none, query_heads, seq_len, kv_group, kv_heads };

struct UlyssesLayout {
  int64_t batch = 0, seq_len = 0, world = 1, rank = 0, q_heads = 0, kv_heads = 0, head_dim = 0;

  // The first accepted-configuration rule the shapes break (none: they are accepted), and with
  // `why` the message naming the numbers. Sizes must be positive.
  static UlyssesDefect defect(int64_t seq_len, int64_t world, int64_t q_heads, int64_t kv_heads,
                              std::string* why = nullptr);
  // Validates (see the header comment) and throws moepeak::Error naming the numbers.
  static UlyssesLayout make(int64_t batch, int64_t seq_len, int64_t world, int64_t rank,
                            int64_t q_heads, int64_t kv_heads, int64_t head_dim);

  int64_t local_seq() const { return seq_len / world; }         // T/W
  int64_t local_tokens() const { return batch * local_seq(); }  // N = B*T/W
  // [begin, end) query heads / kv heads that rank p attends over.
  std::pair<int64_t, int64_t> q_heads_of(int p) const;
  std::pair<int64_t, int64_t> kv_heads_of(int p) const;
  std::pair<int64_t, int64_t> heads_of(HeadKind kind, int p) const;
  int64_t total_heads(HeadKind kind) const { return kind == HeadKind::query ? q_heads : kv_heads; }
  // Number of heads of `kind` rank p holds in the head layout.
  int64_t heads_count(HeadKind kind, int p) const;
  // (B, T/W, h_total, d) and (B, T, h_rank, d) for this rank.
  Shape seq_shape(HeadKind kind) const;
  Shape heads_shape(HeadKind kind) const;
  // True when some kv head is held by more than one rank (nkv < W).
  bool kv_replicated() const { return kv_heads < world; }
};

// Elements of staging one exchange of `kind` needs on this rank (send + receive):
//   B*(T/W)*d*sum_p h_p  +  B*T*h_r*d,   h_p = heads of `kind` on rank p, h_r = this rank's.
// For queries that is 2*N*nh*d; for kv heads N*d*(nkv or W when replicated) + B*T*h_kv,r*d.
// The same for seq_to_heads and heads_to_seq (the two halves swap roles).
int64_t ulysses_staging_elements(const UlyssesLayout& layout, HeadKind kind);

// The staging bytes the planner counts for a layer's exchanges: one buffer serving both kinds,
//   DeviceArena::footprint(max(staging(query), staging(kv)) * dtype_size(dtype)),
// which for the accepted configurations is the same on every rank. (The exchanged tensors
// themselves, x_seq and x_heads, are the layer's attention activations, counted with them.)
uint64_t ulysses_exchange_bytes(const UlyssesLayout& layout, DType dtype);

// A staging tensor of max over kinds of ulysses_staging_elements, from the backend's arena under
// LiveSet::attention.
OwnedTensor make_ulysses_staging(Backend& backend, const UlyssesLayout& layout, DType dtype);

// Forward exchange: x_heads (B, T, h_r, d) = [this rank's heads of] the sequences whose slices
// the ranks hold in x_seq (B, T/W, h_total, d). Written (=). Collective: every rank calls it.
void seq_to_heads(const Tensor& x_seq, const Tensor& x_heads, HeadKind kind, const Tensor& staging,
                  const UlyssesLayout& layout, Comm& comm, Stream& stream);

// Inverse exchange: x_seq (B, T/W, h_total, d) = this rank's token slice of every head, from the
// ranks' x_heads (B, T, h_p, d). Written (=). A head held by several ranks (replicated kv heads):
//   accumulate = true:  the SUM of the ranks' copies, added in increasing source rank (the first
//                       copy, then += each next), so results are deterministic; this is the
//                       backward of replication (dk/dv of a kv head = sum over its users);
//   accumulate = false: the copy of the lowest rank holding the head (the copies are identical
//                       in a forward exchange).
// A head held by one rank is copied either way. Collective.
void heads_to_seq(const Tensor& x_heads, const Tensor& x_seq, HeadKind kind, bool accumulate,
                  const Tensor& staging, const UlyssesLayout& layout, Comm& comm, Stream& stream);

}  // namespace moepeak::schedules
