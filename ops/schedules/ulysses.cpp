// Ulysses head exchange (ops/schedules/ulysses.h): layout validation, the staging formula, and
// the pack / all_to_all_v / unpack sequences of seq_to_heads and heads_to_seq, on the stream of
// either backend (ops::copy_2d, ops::add).
//
// Staging layout of one exchange (elements, es = dtype size), with Lt = T/W, n_p = heads of the
// kind on rank p, n_r this rank's, S = B*Lt*d*sum_p n_p, R = B*T*n_r*d:
//   seq_to_heads:  [ send S: block p = (B, Lt, n_p, d) | receive R: block p = (B, Lt, n_r, d) ]
//   heads_to_seq:  [ send R: block p = (B, Lt, n_r, d) | receive S: block p = (B, Lt, n_p, d) ]
// Block p of a send goes to rank p; block p of a receive comes from rank p; blocks are in rank
// order. Position t of block p in the head layout is global position p*Lt + t.
#include "ops/schedules/ulysses.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/arena.h"
#include "core/runtime/stream_profile.h"
#include "ops/copy_2d.h"
#include "ops/elementwise.h"

namespace moepeak::schedules {

namespace {

// Per-rank head ranges of one kind, and the element counts / offsets of the exchange.
struct Plan {
  int64_t B = 0, T = 0, Lt = 0, d = 0, h_total = 0;
  int world = 1, me = 0;
  std::vector<int64_t> begin, count;  // head range of each rank
  // Elements exchanged with each rank: `wide` blocks are (B, Lt, n_p, d), `narrow` blocks are
  // (B, Lt, n_r, d); offsets are relative to the start of their half of the staging.
  std::vector<size_t> wide_counts, wide_offsets, narrow_counts, narrow_offsets;
  int64_t wide_total = 0, narrow_total = 0;
};

Plan make_plan(const UlyssesLayout& l, HeadKind kind) {
  Plan p;
  p.B = l.batch;
  p.T = l.seq_len;
  p.Lt = l.local_seq();
  p.d = l.head_dim;
  p.h_total = l.total_heads(kind);
  p.world = static_cast<int>(l.world);
  p.me = static_cast<int>(l.rank);
  const size_t w = static_cast<size_t>(p.world);
  p.begin.resize(w);
  p.count.resize(w);
  p.wide_counts.resize(w);
  p.wide_offsets.resize(w);
  p.narrow_counts.resize(w);
  p.narrow_offsets.resize(w);
  for (int r = 0; r < p.world; ++r) {
    auto [b, e] = l.heads_of(kind, r);
    p.begin[r] = b;
    p.count[r] = e - b;
  }
  const int64_t rows = p.B * p.Lt;
  const int64_t n_me = p.count[p.me];
  for (int r = 0; r < p.world; ++r) {
    p.wide_offsets[r] = static_cast<size_t>(p.wide_total);
    p.wide_counts[r] = static_cast<size_t>(rows * p.count[r] * p.d);
    p.wide_total += rows * p.count[r] * p.d;
    p.narrow_offsets[r] = static_cast<size_t>(p.narrow_total);
    p.narrow_counts[r] = static_cast<size_t>(rows * n_me * p.d);
    p.narrow_total += rows * n_me * p.d;
  }
  return p;
}

void check_args(const Tensor& x_seq, const Tensor& x_heads, HeadKind kind, const Tensor& staging,
                const UlyssesLayout& l, const Comm& comm, const char* what) {
  const char* k = kind == HeadKind::query ? "query" : "kv";
  MOEPEAK_CHECK(comm.world_size() == l.world && comm.rank() == l.rank, what,
                ": communicator is rank ", comm.rank(), " of ", comm.world_size(),
                " but the layout is rank ", l.rank, " of ", l.world);
  const DType dt = x_seq.dtype();
  x_seq.expect(l.seq_shape(kind), dt, std::string(what) + " x_seq (" + k + " heads)");
  x_heads.expect(l.heads_shape(kind), dt, std::string(what) + " x_heads (" + k + " heads)");
  const int64_t need = ulysses_staging_elements(l, kind);
  MOEPEAK_CHECK(staging.dtype() == dt && staging.numel() >= need, what, ": staging ", staging.str(),
                " must be ", dtype_name(dt), " with at least ", need, " elements for ", k,
                " heads");
  MOEPEAK_CHECK(x_seq.data() != x_heads.data(), what, ": x_seq and x_heads are the same buffer");
}

}  // namespace

// ---- layout -----------------------------------------------------------------------------------

UlyssesDefect UlyssesLayout::defect(int64_t seq_len, int64_t world, int64_t q_heads,
                                    int64_t kv_heads, std::string* why) {
  MOEPEAK_CHECK(seq_len > 0 && world > 0 && q_heads > 0 && kv_heads > 0,
                "Ulysses layout needs positive sizes: seq_len ", seq_len, ", world ", world,
                ", q_heads ", q_heads, ", kv_heads ", kv_heads);
  auto broken = [&](UlyssesDefect d, auto&&... message) {
    if (why) *why = detail::concat("sequence parallel attention: ", message...);
    return d;
  };
  if (q_heads % world != 0) {
    return broken(UlyssesDefect::query_heads, q_heads, " query heads cannot be split over ", world,
                  " ranks (", q_heads, " % ", world, " = ", q_heads % world,
                  "); the number of ranks must divide the number of query heads");
  }
  if (seq_len % world != 0) {
    return broken(UlyssesDefect::seq_len, "sequence length ", seq_len, " cannot be split over ",
                  world, " ranks (", seq_len, " % ", world, " = ", seq_len % world,
                  "); each rank owns T/W positions of every sequence");
  }
  if (q_heads % kv_heads != 0) {
    return broken(UlyssesDefect::kv_group, q_heads, " query heads are not a multiple of ", kv_heads,
                  " kv heads");
  }
  if (kv_heads % world != 0 && world % kv_heads != 0) {
    return broken(UlyssesDefect::kv_heads, kv_heads, " kv heads on ", world,
                  " ranks: one must divide the other (", q_heads, " query heads in groups of ",
                  q_heads / kv_heads, ", ", q_heads / world,
                  " per rank, would straddle kv heads unevenly)");
  }
  return UlyssesDefect::none;
}

UlyssesLayout UlyssesLayout::make(int64_t batch, int64_t seq_len, int64_t world, int64_t rank,
                                  int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  MOEPEAK_CHECK(
      batch > 0 && seq_len > 0 && world > 0 && q_heads > 0 && kv_heads > 0 && head_dim > 0,
      "Ulysses layout needs positive sizes: batch ", batch, ", seq_len ", seq_len, ", world ",
      world, ", q_heads ", q_heads, ", kv_heads ", kv_heads, ", head_dim ", head_dim);
  MOEPEAK_CHECK(rank >= 0 && rank < world, "Ulysses layout: rank ", rank, " outside [0, ", world,
                ")");
  std::string why;
  if (defect(seq_len, world, q_heads, kv_heads, &why) != UlyssesDefect::none) MOEPEAK_THROW(why);
  return UlyssesLayout{batch, seq_len, world, rank, q_heads, kv_heads, head_dim};
}

std::pair<int64_t, int64_t> UlyssesLayout::q_heads_of(int p) const {
  MOEPEAK_CHECK(p >= 0 && p < world, "Ulysses layout: rank ", p, " outside [0, ", world, ")");
  const int64_t per = q_heads / world;
  return {p * per, (p + 1) * per};
}

std::pair<int64_t, int64_t> UlyssesLayout::kv_heads_of(int p) const {
  auto [qb, qe] = q_heads_of(p);
  const int64_t group = q_heads / kv_heads;
  return {qb / group, (qe - 1) / group + 1};
}

std::pair<int64_t, int64_t> UlyssesLayout::heads_of(HeadKind kind, int p) const {
  return kind == HeadKind::query ? q_heads_of(p) : kv_heads_of(p);
}

int64_t UlyssesLayout::heads_count(HeadKind kind, int p) const {
  auto [b, e] = heads_of(kind, p);
  return e - b;
}

Shape UlyssesLayout::seq_shape(HeadKind kind) const {
  return Shape{batch, local_seq(), total_heads(kind), head_dim};
}

Shape UlyssesLayout::heads_shape(HeadKind kind) const {
  return Shape{batch, seq_len, heads_count(kind, static_cast<int>(rank)), head_dim};
}

// ---- sizes ------------------------------------------------------------------------------------

int64_t ulysses_staging_elements(const UlyssesLayout& layout, HeadKind kind) {
  Plan p = make_plan(layout, kind);
  return p.wide_total + p.narrow_total;
}

uint64_t ulysses_exchange_bytes(const UlyssesLayout& layout, DType dtype) {
  const int64_t elements = std::max(ulysses_staging_elements(layout, HeadKind::query),
                                    ulysses_staging_elements(layout, HeadKind::kv));
  return DeviceArena::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

OwnedTensor make_ulysses_staging(Backend& backend, const UlyssesLayout& layout, DType dtype) {
  const int64_t elements = std::max(ulysses_staging_elements(layout, HeadKind::query),
                                    ulysses_staging_elements(layout, HeadKind::kv));
  return OwnedTensor::device(backend, Shape{elements}, dtype, LiveSet::attention,
                             "Ulysses exchange staging");
}

// ---- exchanges --------------------------------------------------------------------------------

void seq_to_heads(const Tensor& x_seq, const Tensor& x_heads, HeadKind kind, const Tensor& staging,
                  const UlyssesLayout& layout, Comm& comm, Stream& stream) {
  const StreamTrafficTag traffic("ulysses");
  check_args(x_seq, x_heads, kind, staging, layout, comm, "seq_to_heads");
  const Plan p = make_plan(layout, kind);
  const int64_t recv = p.wide_total;  // the receive half starts here (elements)
  const int64_t rows = p.B * p.Lt;

  // Pack: block r = rows (b, t) of x_seq, heads [begin_r, begin_r + n_r): a column block of the
  // (rows, h_total * d) matrix.
  for (int r = 0; r < p.world; ++r) {
    ops::copy_2d(x_seq, {p.begin[r] * p.d, p.h_total * p.d}, staging,
                 {static_cast<int64_t>(p.wide_offsets[r]), p.count[r] * p.d}, rows,
                 p.count[r] * p.d, stream);
  }
  const size_t es = dtype_size(x_seq.dtype());
  comm.all_to_all_v(staging.data(), p.wide_counts, p.wide_offsets,
                    static_cast<char*>(staging.data()) + static_cast<size_t>(recv) * es,
                    p.narrow_counts, p.narrow_offsets, x_seq.dtype(), stream);
  // Unpack: block r holds positions [r*Lt, (r+1)*Lt) of every sequence, this rank's heads; those
  // Lt positions of one sequence are contiguous in both layouts (one row per sequence b).
  const int64_t row_elems = p.count[p.me] * p.d, elems = p.Lt * row_elems;
  for (int r = 0; r < p.world; ++r) {
    ops::copy_2d(staging, {recv + static_cast<int64_t>(p.narrow_offsets[r]), elems}, x_heads,
                 {r * elems, p.T * row_elems}, p.B, elems, stream);
  }
}

void heads_to_seq(const Tensor& x_heads, const Tensor& x_seq, HeadKind kind, bool accumulate,
                  const Tensor& staging, const UlyssesLayout& layout, Comm& comm, Stream& stream) {
  const StreamTrafficTag traffic("ulysses");
  check_args(x_seq, x_heads, kind, staging, layout, comm, "heads_to_seq");
  const Plan p = make_plan(layout, kind);
  const int64_t recv = p.narrow_total;  // the receive half starts here (elements)
  const int64_t rows = p.B * p.Lt;
  // Does any head have more than one holder? Only then does `accumulate` change anything.
  bool replicated = false;
  for (int r = 1; r < p.world; ++r) {
    if (p.begin[r] < p.begin[r - 1] + p.count[r - 1]) replicated = true;
  }
  const bool sum = accumulate && replicated;
  if (sum) {
    // NOTES: heads are replicated only when nkv < W with W % nkv == 0 (UlyssesLayout::make); a
    // rank's nh/W query heads then lie inside one kv head's group (nh/W divides nh/nkv), so every
    // rank holds exactly one kv head and each received block is one contiguous (B*Lt, d) head.
    for (int r = 0; r < p.world; ++r) {
      MOEPEAK_CHECK(p.count[r] == 1, "heads_to_seq: rank ", r, " holds ", p.count[r],
                    " replicated kv heads (one expected)");
    }
  }

  // Pack: block r = positions [r*Lt, (r+1)*Lt) of every sequence, this rank's heads.
  const int64_t row_elems = p.count[p.me] * p.d, elems = p.Lt * row_elems;
  for (int r = 0; r < p.world; ++r) {
    ops::copy_2d(x_heads, {r * elems, p.T * row_elems}, staging,
                 {static_cast<int64_t>(p.narrow_offsets[r]), elems}, p.B, elems, stream);
  }
  const size_t es = dtype_size(x_seq.dtype());
  comm.all_to_all_v(staging.data(), p.narrow_counts, p.narrow_offsets,
                    static_cast<char*>(staging.data()) + static_cast<size_t>(recv) * es,
                    p.wide_counts, p.wide_offsets, x_seq.dtype(), stream);

  if (!sum) {
    // Each head from the lowest rank holding it: walk the ranks in order and copy the heads no
    // earlier rank covered (head ranges are contiguous and increasing in rank).
    int64_t next_head = 0;
    for (int r = 0; r < p.world; ++r) {
      const int64_t end = p.begin[r] + p.count[r];
      if (end <= next_head) continue;
      const int64_t first = std::max(next_head, p.begin[r]), n = end - first;
      ops::copy_2d(staging,
                   {recv + static_cast<int64_t>(p.wide_offsets[r]) + (first - p.begin[r]) * p.d,
                    p.count[r] * p.d},
                   x_seq, {first * p.d, p.h_total * p.d}, rows, n * p.d, stream);
      next_head = end;
    }
    return;
  }
  // Sum of the copies in increasing source rank, formed in the first holder's received block
  // (first copy, then += each next: the same additions in the same order on every backend), then
  // copied into its head's column of x_seq.
  for (int r = 0; r < p.world;) {
    int next = r + 1;
    const Tensor block =
        staging.rows(recv + static_cast<int64_t>(p.wide_offsets[r]),
                     recv + static_cast<int64_t>(p.wide_offsets[r] + p.wide_counts[r]));
    for (; next < p.world && p.begin[next] == p.begin[r]; ++next) {
      const int64_t other = recv + static_cast<int64_t>(p.wide_offsets[next]);
      ops::add(block, staging.rows(other, other + block.numel()), block, stream);
    }
    ops::copy_2d(block, {0, p.d}, x_seq, {p.begin[r] * p.d, p.h_total * p.d}, rows, p.d, stream);
    r = next;
  }
}

}  // namespace moepeak::schedules
