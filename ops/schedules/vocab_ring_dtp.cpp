// RingDtpVocab: the Ring-DTP vocabulary projection (see the header for the layout, the payloads
// and the memory formula). Four rings — forward and backward, each for both payloads — share one
// pattern:
//   - a read-only payload (W, or X with its labels [and state]) is used in place by its owner in
//     round 0 and arrives in one of two receive buffers for rounds 1..P-1; the shift that brings
//     round k+1's payload is issued at the top of round k, so it overlaps round k's GEMMs;
//   - a travelling accumulator (dW, dX, or the forward state) starts in the owner's own tensor,
//     is updated by the holder of round k, sent on as soon as round k's last update is queued,
//     and after round P-1 takes one more hop, which brings every accumulator home.
// Rank r holds in round k the batch or shard of rank (r - k) mod P.
//
// NOTES (stream ordering): compute runs on the caller's stream, traffic on comm_stream_, each
// hand-over through an event:
//   - comm waits `start` (recorded on the caller's stream at entry) before it reads x, lm_head or
//     the labels, which earlier work on the caller's stream may still be writing;
//   - compute waits `arrived[k]` before it reads round k's payload, and `acc_arrived[k]` before
//     its first update of the travelling accumulator in round k;
//   - comm waits `computed[k-1]` before it receives into the buffer round k-1 read (the receive
//     buffers alternate), and `acc_done[k]` before it sends round k's accumulator;
//   - the caller's stream waits the last hop before the call returns; both streams are
//     synchronised before any buffer is released, since a host release is ordered with only one
//     stream.
// Test: ctest -R ring_dtp --output-on-failure
#include "ops/schedules/vocab_ring_dtp.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/stream_profile.h"
#include "ops/convert.h"
#include "ops/cross_entropy.h"
#include "ops/cross_entropy_strip.h"
#include "ops/linear.h"
#include "ops/matmul.h"
#include "ops/schedules/schedule_dtype.h"

namespace moepeak::schedules {
namespace {

constexpr int64_t kStateWidth = 3;  // (m, z, t) per token, f64

int receive_buffers(int ranks) { return std::min(ranks - 1, 2); }

// Runs `drain` when it goes out of scope. Declared after a ring's buffers, it is destroyed before
// them, so a ring that throws half-way still lets its queued tasks finish before their buffers go.
template <typename F>
struct DrainOnExit {
  F drain;
  ~DrainOnExit() {
    try {
      drain();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the ring's own error is already in flight
    }
  }
};
template <typename F>
DrainOnExit(F) -> DrainOnExit<F>;

// Calls f(begin, end, first, last) for consecutive column ranges of at most `width` columns.
template <typename F>
void for_each_strip(int64_t columns, int64_t width, F&& f) {
  for (int64_t a = 0; a < columns; a += width) {
    const int64_t b = std::min(a + width, columns);
    f(a, b, a == 0, b == columns);
  }
}

}  // namespace

// ---- sizes -----------------------------------------------------------------------------------

VocabInterval vocab_shard(int64_t vocab, int ranks, int rank) {
  MOEPEAK_CHECK(ranks > 0 && rank >= 0 && rank < ranks, "vocab_shard: rank ", rank, " of ", ranks);
  MOEPEAK_CHECK(vocab >= ranks, "Ring-DTP needs at least one vocabulary row per rank: V = ", vocab,
                ", P = ", ranks);
  return {rank * vocab / ranks, (rank + 1) * vocab / ranks};
}

int64_t vocab_shard_max(int64_t vocab, int ranks) {
  MOEPEAK_CHECK(ranks > 0 && vocab >= ranks,
                "Ring-DTP needs at least one vocabulary row per rank: V = ", vocab,
                ", P = ", ranks);
  return (vocab + ranks - 1) / ranks;
}

int64_t ring_dtp_strip_columns(int64_t vocab, int ranks, int64_t strip) {
  MOEPEAK_CHECK(strip >= 0, "schedules.vocab_strip = ", strip,
                " (0 = whole shard, or a positive "
                "number of columns)");
  const int64_t shard = vocab_shard_max(vocab, ranks);
  return strip == 0 ? shard : std::min(strip, shard);
}

VocabPayload ring_dtp_resolve_payload(VocabPayload payload, int64_t tokens, int64_t vocab,
                                      int ranks) {
  if (payload != VocabPayload::automatic) return payload;
  // NOTES: a hop moves N H b bytes of activations or about (V/P) H b of weights: move the
  // smaller, i.e. weights when N > V/P. Compared as N P > V so uneven shards need no rounding.
  return tokens * ranks > vocab ? VocabPayload::weights : VocabPayload::activations;
}

RingDtpStripCount ring_dtp_strip_count(int64_t vocab, int ranks, int64_t strip,
                                       VocabPayload resolved_payload) {
  MOEPEAK_CHECK(resolved_payload != VocabPayload::automatic,
                "ring_dtp_strip_count: resolve the payload first");
  const int64_t c = ring_dtp_strip_columns(vocab, ranks, strip);  // checks V >= P
  auto strips = [c](int64_t columns) { return (columns + c - 1) / c; };
  RingDtpStripCount n;
  if (resolved_payload == VocabPayload::weights) {  // every shard passes every rank once
    for (int s = 0; s < ranks; ++s) n.most += strips(vocab_shard(vocab, ranks, s).size());
    n.fewest = n.most;
  } else {  // P rounds over the rank's own shard: floor(V/P) or ceil(V/P) columns
    n.fewest = ranks * strips(vocab / ranks);
    n.most = ranks * strips(vocab_shard_max(vocab, ranks));
  }
  return n;
}

int64_t ring_dtp_kept_strips(int64_t vocab, int ranks, int64_t strip, int64_t kept,
                             VocabPayload resolved_payload) {
  MOEPEAK_CHECK(kept >= 0, "schedules.vocab_kept_strips = ", kept,
                " (strips kept from forward to backward: 0 or more)");
  return std::min(kept, ring_dtp_strip_count(vocab, ranks, strip, resolved_payload).fewest);
}

RingDtpBytes ring_dtp_memory(int64_t tokens, int64_t hidden, int64_t vocab, int ranks,
                             int64_t strip, int64_t kept, VocabPayload payload, DType dtype) {
  MOEPEAK_CHECK(tokens >= 0 && hidden > 0 && ranks > 0, "ring_dtp_memory: tokens ", tokens,
                ", hidden ", hidden, ", ranks ", ranks);
  auto fp = [](int64_t bytes) { return DeviceArena::footprint(static_cast<uint64_t>(bytes)); };
  const int64_t N = tokens, H = hidden, b = static_cast<int64_t>(dtype_size(dtype));
  const int64_t bg = static_cast<int64_t>(dtype_size(main_grad_dtype(dtype)));
  // The fp32 home dX accumulator of bf16 storage (backward only; none when bg == b).
  const uint64_t dx_home = bg != b ? fp(N * H * bg) : 0;
  const int64_t c = ring_dtp_strip_columns(vocab, ranks, strip);
  const int64_t Vm = vocab_shard_max(vocab, ranks);
  const uint64_t h = static_cast<uint64_t>(receive_buffers(ranks));
  const VocabPayload resolved = ring_dtp_resolve_payload(payload, tokens, vocab, ranks);
  RingDtpBytes m;
  m.strip = fp(N * c * b);
  m.state = fp(N * kStateWidth * 8);
  m.kept_strips = ring_dtp_kept_strips(vocab, ranks, strip, kept, resolved);
  m.kept = m.kept_strips > 0 ? fp(m.kept_strips * N * c * b) : 0;
  const bool work = m.kept_strips < ring_dtp_strip_count(vocab, ranks, strip, resolved).most;
  m.saved = m.state + m.kept;
  const uint64_t base = m.saved + (work ? m.strip : 0);
  switch (resolved) {
    case VocabPayload::weights: {
      const uint64_t shard = fp(Vm * H * b);
      m.forward = base + h * shard;                                   // W
      m.backward = base + h * shard + h * fp(Vm * H * bg) + dx_home;  // W, dW (, dX home)
      break;
    }
    default: {
      const uint64_t batch = fp(N * H * b) + fp(N * 8) + m.state;    // X, labels, a state
      m.forward = base + h * batch + (ranks > 1 ? m.state : 0);      // + partial state
      m.backward = base + h * batch + h * fp(N * H * bg) + dx_home;  // + dX (, dX home)
      break;
    }
  }
  return m;
}

uint64_t ring_dtp_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int ranks, int64_t strip,
                        int64_t kept, VocabPayload payload, DType dtype) {
  return ring_dtp_memory(tokens, hidden, vocab, ranks, strip, kept, payload, dtype).peak();
}

// ---- the schedule ----------------------------------------------------------------------------

struct RingDtpVocab::Problem {
  int64_t N = 0, H = 0;
  int P = 1, r = 0, right = 0, left = 0;
  VocabPayload payload = VocabPayload::weights;
  int64_t strip = 0;                  // columns per strip
  std::vector<VocabInterval> shards;  // every rank's vocabulary interval
  int held(int k) const { return ((r - k) % P + P) % P; }
};

RingDtpVocab::RingDtpVocab(Backend& backend, Stream& stream, Comm& comm, DType dtype, int64_t vocab,
                           VocabPayload payload, int64_t strip, int64_t kept)
    : backend_(backend),
      stream_(stream),
      dtype_(dtype),
      vocab_(vocab),
      ranks_(comm.world_size()),
      rank_(comm.rank()),
      payload_(payload),
      resolved_(payload),
      kept_requested_(kept) {
  check_schedule_dtype(backend, dtype, "Ring-DTP");
  strip_columns_ = ring_dtp_strip_columns(vocab, ranks_, strip);  // checks V >= P, strip >= 0
  ring_dtp_kept_strips(vocab, ranks_, strip, kept, VocabPayload::weights);  // checks kept >= 0
  shard_ = vocab_shard(vocab, ranks_, rank_);
  if (ranks_ > 1) comm_ = comm.duplicate();
  comm_stream_ = backend.create_stream("ring-dtp comm", StreamPriority::high);
}

RingDtpVocab::~RingDtpVocab() {
  // NOTES: a forward or backward that threw may have left work queued that uses our buffers.
  try {
    synchronize_streams();
  } catch (...) {  // NOLINT(bugprone-empty-catch): the error was reported by the failing call
  }
}

void RingDtpVocab::synchronize_streams() {
  // Both, even when the first rethrows a sticky error, so no queued task outlives a buffer.
  std::exception_ptr first;
  for (Stream* s : {comm_stream_.get(), &stream_}) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

RingDtpVocab::Problem RingDtpVocab::check(const Tensor& x, const Tensor& lm_head_shard,
                                          const Tensor& labels) const {
  MOEPEAK_CHECK(x.ndim() == 2 && x.dtype() == dtype_, "Ring-DTP: x must be ", dtype_name(dtype_),
                "(N, H), got ", x.str());
  Problem p;
  p.N = x.size(0);
  p.H = x.size(1);
  p.P = ranks_;
  p.r = rank_;
  p.right = (rank_ + 1) % ranks_;
  p.left = (rank_ + ranks_ - 1) % ranks_;
  p.payload = ring_dtp_resolve_payload(payload_, p.N, vocab_, ranks_);
  p.strip = strip_columns_;
  for (int s = 0; s < ranks_; ++s) p.shards.push_back(vocab_shard(vocab_, ranks_, s));
  lm_head_shard.expect(Shape{shard_.size(), p.H}, dtype_,
                       "Ring-DTP: lm_head shard of rank " + std::to_string(rank_) + " (rows [" +
                           std::to_string(shard_.begin) + ", " + std::to_string(shard_.end) +
                           ") of V = " + std::to_string(vocab_) + ")");
  labels.expect(Shape{p.N}, DType::i64, "Ring-DTP: labels");
  return p;
}

OwnedTensor RingDtpVocab::alloc(Shape shape, DType dtype, const char* what) {
  return OwnedTensor::device(backend_, shape, dtype, LiveSet::logits, what);
}

Tensor RingDtpVocab::strip_at(int64_t q, int64_t columns, const OwnedTensor& working) const {
  // (N, columns): a kept slot holds (N, c); a narrower last strip of a round uses its front.
  void* data = q < kept_ ? static_cast<char*>(saved_strips_.data()) +
                               q * tokens_ * strip_columns_ * dtype_size(dtype_)
                         : working.data();
  MOEPEAK_CHECK(data != nullptr, "Ring-DTP: strip ", q, " is neither kept nor has a working strip");
  return Tensor(data, Shape{tokens_, columns}, dtype_, Placement::device, &backend_);
}

OwnedTensor RingDtpVocab::alloc_working_strip(const Problem& p) {
  const int64_t most = ring_dtp_strip_count(vocab_, ranks_, strip_columns_, p.payload).most;
  if (kept_ >= most) return OwnedTensor();  // NOTES: every strip of every rank is kept
  return alloc(Shape{p.N, p.strip}, dtype_, "ring-dtp strip");  // (N, c)
}

std::unique_ptr<Event> RingDtpVocab::record(Stream& stream) {
  auto event = backend_.create_event();
  event->record(stream);
  return event;
}

double RingDtpVocab::forward(const Tensor& x, const Tensor& lm_head_shard, const Tensor& labels,
                             double loss_scale) {
  const StreamTrafficTag traffic("vocab");
  release();
  const Problem p = check(x, lm_head_shard, labels);
  resolved_ = p.payload;
  tokens_ = p.N;
  hidden_ = p.H;
  OwnedTensor state = alloc(Shape{p.N, kStateWidth}, DType::f64, "ring-dtp home state");
  kept_ = ring_dtp_kept_strips(vocab_, ranks_, strip_columns_, kept_requested_, p.payload);
  if (kept_ > 0) {
    saved_strips_ = alloc(Shape{kept_, p.N, p.strip}, dtype_, "ring-dtp kept strips");
  }
  double sum = 0;
  try {
    if (p.payload == VocabPayload::weights) {
      forward_weights(p, x, lm_head_shard, labels, state);
    } else {
      forward_activations(p, x, lm_head_shard, labels, state);
    }
    // The state and labels to the host: per token lse - t, summed in token order in double.
    std::vector<double> st = copy_to_host_as_double(state, backend_, stream_);
    std::vector<char> label_bytes = copy_to_host(labels, backend_, stream_);
    std::vector<int64_t> label(static_cast<size_t>(p.N));
    std::memcpy(label.data(), label_bytes.data(), label.size() * sizeof(int64_t));
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t l = label[n];
      if (l == ops::kIgnoreLabel) continue;
      if (l < 0 || l >= vocab_) {
        MOEPEAK_THROW("Ring-DTP: label ", l, " at position ", n, " is outside [0, ", vocab_,
                      ") and is not the ignore label ", ops::kIgnoreLabel);
      }
      sum += st[3 * n] + std::log(st[3 * n + 1]) - st[3 * n + 2];
    }
  } catch (...) {
    release();  // NOTES: the rings drained both streams on their way out; nothing uses the strips
    throw;
  }
  saved_state_ = std::move(state);
  labels_ = labels;
  loss_scale_ = loss_scale;
  return sum * loss_scale;
}

void RingDtpVocab::backward(const Tensor& x, const Tensor& lm_head_shard, const Tensor& dx,
                            const Tensor& dlm_head_shard) {
  const StreamTrafficTag traffic("vocab");
  MOEPEAK_CHECK(saved_state_.view().defined(), "Ring-DTP backward without a forward to go with it");
  const Problem p = check(x, lm_head_shard, labels_);
  MOEPEAK_CHECK(p.N == tokens_ && p.H == hidden_, "Ring-DTP backward on x ", x.str(),
                " after a forward on (", tokens_, ", ", hidden_, ")");
  dx.expect(x.shape(), dtype_, "Ring-DTP: dx");
  const DType grad = main_grad_dtype(dtype_);
  dlm_head_shard.expect(lm_head_shard.shape(), grad, "Ring-DTP: dlm_head shard");
  // NOTES: dX is a sum over every strip of every round; with bf16 storage it accumulates (and
  // travels) in an fp32 buffer and is rounded into dx once at the end, as the materialised
  // projection's one GEMM rounds it once.
  OwnedTensor dx_home;
  if (grad != dtype_) dx_home = alloc(x.shape(), grad, "ring-dtp dX home");
  const Tensor dx_sum = grad != dtype_ ? dx_home.view() : dx;
  if (p.payload == VocabPayload::weights) {
    backward_weights(p, x, lm_head_shard, dx_sum, dlm_head_shard);
  } else {
    backward_activations(p, x, lm_head_shard, dx_sum, dlm_head_shard);
  }
  if (grad != dtype_) {
    ops::convert(dx_sum, dx, stream_);
    stream_.synchronize();
  }
  release();
}

void RingDtpVocab::release() {
  // NOTES: no synchronisation needed: forward() and backward() return with both streams past
  // every use of the saved state.
  saved_state_.reset();
  saved_strips_.reset();
  kept_ = 0;
  labels_ = Tensor();
}

// ---- forward, weights travel -----------------------------------------------------------------
// Round k: the shard W_s, s = held(k), against this rank's X; the state stays home.
void RingDtpVocab::forward_weights(const Problem& p, const Tensor& x, const Tensor& w,
                                   const Tensor& labels, const Tensor& state) {
  const int P = p.P;
  const int64_t H = p.H, Vm = vocab_shard_max(vocab_, P);
  const OwnedTensor strip = alloc_working_strip(p);  // (N, c), unless every strip is kept
  int64_t q = 0;                                     // strips formed so far in this pass
  std::array<OwnedTensor, 2> wbuf;                   // (Vm, H) each
  for (int i = 0; i < receive_buffers(P); ++i) wbuf[i] = alloc(Shape{Vm, H}, dtype_, "ring-dtp W");
  auto rows_of = [&](int k) { return p.shards[p.held(k)].size(); };
  auto w_of = [&](int k) { return k == 0 ? w : wbuf[(k - 1) % 2].view().rows(0, rows_of(k)); };

  ops::cross_entropy_state_init(state, stream_);
  DrainOnExit drain{[this] { synchronize_streams(); }};
  comm_stream_->wait(*record(stream_));  // start: x, w, labels are ready
  std::vector<std::unique_ptr<Event>> computed(P), arrived(P);
  for (int k = 0; k < P; ++k) {
    if (k + 1 < P) {  // next round's shard, while this round computes
      if (k >= 2) comm_stream_->wait(*computed[k - 1]);  // wbuf[k % 2] was round k-1's
      comm_->sendrecv(w_of(k).data(), rows_of(k) * H, p.right, wbuf[k % 2].data(),
                      rows_of(k + 1) * H, p.left, dtype_, *comm_stream_);
      arrived[k + 1] = record(*comm_stream_);
    }
    if (k >= 1) stream_.wait(*arrived[k]);
    const Tensor wk = w_of(k);
    const int64_t column0 = p.shards[p.held(k)].begin;
    for_each_strip(rows_of(k), p.strip, [&](int64_t a, int64_t b, bool, bool) {
      const Tensor y = strip_at(q++, b - a, strip);  // (N, b-a)
      ops::linear_forward(x, wk.rows(a, b), y, false, stream_);
      ops::cross_entropy_strip_forward(y, labels, column0 + a, state, stream_);
    });
    computed[k] = record(stream_);
  }
  synchronize_streams();
}

// ---- forward, activations travel -------------------------------------------------------------
// Round k: the batch X_j, j = held(k), with its labels, against this rank's shard. Its state
// arrives one round behind: round k folds into a fresh partial state, merges it into the
// arriving state, and sends that on (after round P-1: home).
void RingDtpVocab::forward_activations(const Problem& p, const Tensor& x, const Tensor& w,
                                       const Tensor& labels, const Tensor& state) {
  const int P = p.P;
  const int64_t N = p.N, H = p.H;
  const OwnedTensor strip = alloc_working_strip(p);  // (N, c), unless every strip is kept
  int64_t q = 0;                                     // strips formed so far in this pass
  std::array<OwnedTensor, 2> xbuf, lbuf, sbuf;       // (N, H), (N) i64, (N, 3) f64
  for (int i = 0; i < receive_buffers(P); ++i) {
    xbuf[i] = alloc(Shape{N, H}, dtype_, "ring-dtp X");
    lbuf[i] = alloc(Shape{N}, DType::i64, "ring-dtp labels");
    sbuf[i] = alloc(Shape{N, kStateWidth}, DType::f64, "ring-dtp arriving state");
  }
  OwnedTensor partial;
  if (P > 1) partial = alloc(Shape{N, kStateWidth}, DType::f64, "ring-dtp partial state");
  auto x_of = [&](int k) { return k == 0 ? x : xbuf[(k - 1) % 2].view(); };
  auto l_of = [&](int k) { return k == 0 ? labels : lbuf[(k - 1) % 2].view(); };
  auto acc_of = [&](int k) { return k == 0 ? state : sbuf[(k - 1) % 2].view(); };
  const size_t state_count = static_cast<size_t>(N * kStateWidth);

  ops::cross_entropy_state_init(state, stream_);
  DrainOnExit drain{[this] { synchronize_streams(); }};
  comm_stream_->wait(*record(stream_));  // start
  std::vector<std::unique_ptr<Event>> computed(P), arrived(P), acc_arrived(P + 1);
  for (int k = 0; k < P; ++k) {
    if (k + 1 < P) {  // next round's batch and labels
      if (k >= 2) comm_stream_->wait(*computed[k - 1]);
      comm_->sendrecv(x_of(k).data(), N * H, p.right, xbuf[k % 2].data(), N * H, p.left, dtype_,
                      *comm_stream_);
      comm_->sendrecv(l_of(k).data(), N, p.right, lbuf[k % 2].data(), N, p.left, DType::i64,
                      *comm_stream_);
      arrived[k + 1] = record(*comm_stream_);
    }
    if (k >= 1) stream_.wait(*arrived[k]);
    const Tensor target = k == 0 ? state : partial.view();
    if (k >= 1) ops::cross_entropy_state_init(partial, stream_);
    for_each_strip(p.shards[p.r].size(), p.strip, [&](int64_t a, int64_t b, bool, bool) {
      const Tensor y = strip_at(q++, b - a, strip);  // (N, b-a)
      ops::linear_forward(x_of(k), w.rows(a, b), y, false, stream_);
      ops::cross_entropy_strip_forward(y, l_of(k), p.shards[p.r].begin + a, target, stream_);
    });
    if (k >= 1) {
      stream_.wait(*acc_arrived[k]);
      ops::cross_entropy_state_merge(partial, acc_of(k), stream_);
    }
    computed[k] = record(stream_);
    if (P > 1) {  // the state on to the batch's next holder, or home after the last round
      comm_stream_->wait(*computed[k]);
      void* into = k + 1 < P ? sbuf[k % 2].data() : state.data();
      comm_->sendrecv(acc_of(k).data(), state_count, p.right, into, state_count, p.left, DType::f64,
                      *comm_stream_);
      acc_arrived[k + 1] = record(*comm_stream_);
    }
  }
  if (P > 1) stream_.wait(*acc_arrived[P]);
  synchronize_streams();
}

// ---- backward, weights travel ----------------------------------------------------------------
// Round k: the shard W_s and its gradient accumulator dW_s travel; dX accumulates at home.
void RingDtpVocab::backward_weights(const Problem& p, const Tensor& x, const Tensor& w,
                                    const Tensor& dx, const Tensor& dw) {
  const int P = p.P;
  const int64_t H = p.H, Vm = vocab_shard_max(vocab_, P);
  const OwnedTensor strip = alloc_working_strip(p);  // (N, c), unless every strip is kept
  int64_t q = 0;                                     // strips formed so far in this pass
  std::array<OwnedTensor, 2> wbuf, dbuf;             // (Vm, H) each
  for (int i = 0; i < receive_buffers(P); ++i) {
    wbuf[i] = alloc(Shape{Vm, H}, dtype_, "ring-dtp W");
    dbuf[i] = alloc(Shape{Vm, H}, dw.dtype(), "ring-dtp dW");  // main_grad_dtype
  }
  auto rows_of = [&](int k) { return p.shards[p.held(k)].size(); };
  auto w_of = [&](int k) { return k == 0 ? w : wbuf[(k - 1) % 2].view().rows(0, rows_of(k)); };
  auto dw_of = [&](int k) { return k == 0 ? dw : dbuf[(k - 1) % 2].view().rows(0, rows_of(k)); };

  DrainOnExit drain{[this] { synchronize_streams(); }};
  comm_stream_->wait(*record(stream_));  // start
  std::vector<std::unique_ptr<Event>> computed(P), arrived(P), acc_done(P), acc_arrived(P + 1);
  for (int k = 0; k < P; ++k) {
    if (k + 1 < P) {
      if (k >= 2) comm_stream_->wait(*computed[k - 1]);
      comm_->sendrecv(w_of(k).data(), rows_of(k) * H, p.right, wbuf[k % 2].data(),
                      rows_of(k + 1) * H, p.left, dtype_, *comm_stream_);
      arrived[k + 1] = record(*comm_stream_);
    }
    if (k >= 1) stream_.wait(*arrived[k]);
    const Tensor wk = w_of(k), dwk = dw_of(k);
    const int64_t column0 = p.shards[p.held(k)].begin;
    for_each_strip(rows_of(k), p.strip, [&](int64_t a, int64_t b, bool first, bool last) {
      const bool kept = q < kept_;
      const Tensor g = strip_at(q++, b - a, strip);  // (N, b-a)
      if (!kept) ops::linear_forward(x, wk.rows(a, b), g, false, stream_);
      ops::cross_entropy_strip_backward(g, labels_, column0 + a, saved_state_, loss_scale_, g,
                                        stream_);
      if (first && k >= 1) stream_.wait(*acc_arrived[k]);
      ops::linear_backward(x, wk.rows(a, b), g, Tensor(), false, dwk.rows(a, b), stream_);
      if (last) acc_done[k] = record(stream_);
      ops::matmul(g, wk.rows(a, b), dx, !(k == 0 && first), stream_);  // dX at home
    });
    computed[k] = record(stream_);
    if (P > 1) {  // dW_s on to the next rank; after the last round to its owner
      comm_stream_->wait(*acc_done[k]);
      void* into = k + 1 < P ? dbuf[k % 2].data() : dw.data();
      comm_->sendrecv(dwk.data(), rows_of(k) * H, p.right, into, rows_of(k + 1) * H, p.left,
                      dw.dtype(), *comm_stream_);
      acc_arrived[k + 1] = record(*comm_stream_);
    }
  }
  if (P > 1) stream_.wait(*acc_arrived[P]);
  synchronize_streams();
}

// ---- backward, activations travel ------------------------------------------------------------
// Round k: X_j with its labels and final state, and its dX accumulator, travel; dW_r accumulates
// at home.
void RingDtpVocab::backward_activations(const Problem& p, const Tensor& x, const Tensor& w,
                                        const Tensor& dx, const Tensor& dw) {
  const int P = p.P;
  const int64_t N = p.N, H = p.H;
  const OwnedTensor strip = alloc_working_strip(p);   // (N, c), unless every strip is kept
  int64_t q = 0;                                      // strips formed so far in this pass
  std::array<OwnedTensor, 2> xbuf, lbuf, sbuf, dbuf;  // (N, H), (N) i64, (N, 3) f64, (N, H)
  for (int i = 0; i < receive_buffers(P); ++i) {
    xbuf[i] = alloc(Shape{N, H}, dtype_, "ring-dtp X");
    lbuf[i] = alloc(Shape{N}, DType::i64, "ring-dtp labels");
    sbuf[i] = alloc(Shape{N, kStateWidth}, DType::f64, "ring-dtp state");
    dbuf[i] = alloc(Shape{N, H}, dx.dtype(), "ring-dtp dX");  // main_grad_dtype
  }
  auto x_of = [&](int k) { return k == 0 ? x : xbuf[(k - 1) % 2].view(); };
  auto l_of = [&](int k) { return k == 0 ? labels_ : lbuf[(k - 1) % 2].view(); };
  auto s_of = [&](int k) { return k == 0 ? saved_state_.view() : sbuf[(k - 1) % 2].view(); };
  auto dx_of = [&](int k) { return k == 0 ? dx : dbuf[(k - 1) % 2].view(); };
  const size_t state_count = static_cast<size_t>(N * kStateWidth);
  const VocabInterval own = p.shards[p.r];

  DrainOnExit drain{[this] { synchronize_streams(); }};
  comm_stream_->wait(*record(stream_));  // start
  std::vector<std::unique_ptr<Event>> computed(P), arrived(P), acc_done(P), acc_arrived(P + 1);
  for (int k = 0; k < P; ++k) {
    if (k + 1 < P) {  // next round's batch, labels and final state
      if (k >= 2) comm_stream_->wait(*computed[k - 1]);
      comm_->sendrecv(x_of(k).data(), N * H, p.right, xbuf[k % 2].data(), N * H, p.left, dtype_,
                      *comm_stream_);
      comm_->sendrecv(l_of(k).data(), N, p.right, lbuf[k % 2].data(), N, p.left, DType::i64,
                      *comm_stream_);
      comm_->sendrecv(s_of(k).data(), state_count, p.right, sbuf[k % 2].data(), state_count, p.left,
                      DType::f64, *comm_stream_);
      arrived[k + 1] = record(*comm_stream_);
    }
    if (k >= 1) stream_.wait(*arrived[k]);
    const Tensor xk = x_of(k), dxk = dx_of(k);
    for_each_strip(own.size(), p.strip, [&](int64_t a, int64_t b, bool first, bool last) {
      const bool kept = q < kept_;
      const Tensor g = strip_at(q++, b - a, strip);  // (N, b-a)
      if (!kept) ops::linear_forward(xk, w.rows(a, b), g, false, stream_);
      ops::cross_entropy_strip_backward(g, l_of(k), own.begin + a, s_of(k), loss_scale_, g,
                                        stream_);
      if (first && k >= 1) stream_.wait(*acc_arrived[k]);
      ops::matmul(g, w.rows(a, b), dxk, !(k == 0 && first), stream_);  // travelling dX
      if (last) acc_done[k] = record(stream_);
      ops::linear_backward(xk, w.rows(a, b), g, Tensor(), false, dw.rows(a, b), stream_);
    });
    computed[k] = record(stream_);
    if (P > 1) {  // dX_j on to the batch's next holder; after the last round home into dx
      comm_stream_->wait(*acc_done[k]);
      void* into = k + 1 < P ? dbuf[k % 2].data() : dx.data();
      comm_->sendrecv(dxk.data(), N * H, p.right, into, N * H, p.left, dx.dtype(), *comm_stream_);
      acc_arrived[k + 1] = record(*comm_stream_);
    }
  }
  if (P > 1) stream_.wait(*acc_arrived[P]);
  synchronize_streams();
}

}  // namespace moepeak::schedules
