// Ulysses head exchange (ops/schedules/ulysses.h): layout validation, the staging formula, and
// the pack / all_to_all_v / unpack sequences of seq_to_heads and heads_to_seq on a CPU stream.
//
// Staging layout of one exchange (elements, es = dtype size), with Lt = T/W, n_p = heads of the
// kind on rank p, n_r this rank's, S = B*Lt*d*sum_p n_p, R = B*T*n_r*d:
//   seq_to_heads:  [ send S: block p = (B, Lt, n_p, d) | receive R: block p = (B, Lt, n_r, d) ]
//   heads_to_seq:  [ send R: block p = (B, Lt, n_r, d) | receive S: block p = (B, Lt, n_p, d) ]
// Block p of a send goes to rank p; block p of a receive comes from rank p; blocks are in rank
// order. Position t of block p in the head layout is global position p*Lt + t.
#include "ops/schedules/ulysses.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/runtime/arena.h"
#include "core/runtime/cpu_stream.h"
#include "ops/op_common.h"

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
  MOEPEAK_CHECK(staging.dtype() == dt && staging.numel() >= need, what, ": staging ",
                staging.str(), " must be ", dtype_name(dt), " with at least ", need,
                " elements for ", k, " heads");
  MOEPEAK_CHECK(x_seq.data() != x_heads.data(), what, ": x_seq and x_heads are the same buffer");
}

char* at(void* base, int64_t elements, size_t es) {
  return static_cast<char*>(base) + static_cast<size_t>(elements) * es;
}
const char* at(const void* base, int64_t elements, size_t es) {
  return static_cast<const char*>(base) + static_cast<size_t>(elements) * es;
}

}  // namespace

// ---- layout -----------------------------------------------------------------------------------

UlyssesLayout UlyssesLayout::make(int64_t batch, int64_t seq_len, int64_t world, int64_t rank,
                                  int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  MOEPEAK_CHECK(batch > 0 && seq_len > 0 && world > 0 && q_heads > 0 && kv_heads > 0 &&
                    head_dim > 0,
                "Ulysses layout needs positive sizes: batch ", batch, ", seq_len ", seq_len,
                ", world ", world, ", q_heads ", q_heads, ", kv_heads ", kv_heads, ", head_dim ",
                head_dim);
  MOEPEAK_CHECK(rank >= 0 && rank < world, "Ulysses layout: rank ", rank, " outside [0, ", world,
                ")");
  if (q_heads % world != 0) {
    MOEPEAK_THROW("sequence parallel attention: ", q_heads, " query heads cannot be split over ",
                  world, " ranks (", q_heads, " % ", world, " = ", q_heads % world,
                  "); the number of ranks must divide the number of query heads");
  }
  if (seq_len % world != 0) {
    MOEPEAK_THROW("sequence parallel attention: sequence length ", seq_len,
                  " cannot be split over ", world, " ranks (", seq_len, " % ", world, " = ",
                  seq_len % world, "); each rank owns T/W positions of every sequence");
  }
  if (q_heads % kv_heads != 0) {
    MOEPEAK_THROW("sequence parallel attention: ", q_heads, " query heads are not a multiple of ",
                  kv_heads, " kv heads");
  }
  if (kv_heads % world != 0 && world % kv_heads != 0) {
    MOEPEAK_THROW("sequence parallel attention: ", kv_heads, " kv heads on ", world,
                  " ranks: one must divide the other (", q_heads, " query heads in groups of ",
                  q_heads / kv_heads, ", ", q_heads / world,
                  " per rank, would straddle kv heads unevenly)");
  }
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

void seq_to_heads(const Tensor& x_seq, const Tensor& x_heads, HeadKind kind,
                  const Tensor& staging, const UlyssesLayout& layout, Comm& comm,
                  Stream& stream) {
  check_args(x_seq, x_heads, kind, staging, layout, comm, "seq_to_heads");
  CpuStream& cpu = as_cpu_stream(stream);
  const DType dt = x_seq.dtype();
  const size_t es = dtype_size(dt);
  auto plan = std::make_shared<const Plan>(make_plan(layout, kind));
  void* send = staging.data();
  void* recv = at(staging.data(), plan->wide_total, es);
  const void* src = x_seq.data();
  void* dst = x_heads.data();

  // Pack: block p = rows (b, t) of x_seq, heads [begin_p, begin_p + n_p).
  cpu.enqueue([plan, src, send, es] {
    const Plan& p = *plan;
    for (int r = 0; r < p.world; ++r) {
      const int64_t n = p.count[r], row_bytes = n * p.d;
      char* out = at(send, static_cast<int64_t>(p.wide_offsets[r]), es);
      for (int64_t row = 0; row < p.B * p.Lt; ++row) {
        const char* in = at(src, (row * p.h_total + p.begin[r]) * p.d, es);
        std::memcpy(out + static_cast<size_t>(row * row_bytes) * es, in,
                    static_cast<size_t>(row_bytes) * es);
      }
    }
  });
  comm.all_to_all_v(send, plan->wide_counts, plan->wide_offsets, recv, plan->narrow_counts,
                    plan->narrow_offsets, dt, stream);
  // Unpack: block p holds positions [p*Lt, (p+1)*Lt) of every sequence, this rank's heads.
  cpu.enqueue([plan, recv, dst, es] {
    const Plan& p = *plan;
    const int64_t row_elems = p.count[p.me] * p.d;
    for (int r = 0; r < p.world; ++r) {
      const char* in = at(recv, static_cast<int64_t>(p.narrow_offsets[r]), es);
      for (int64_t b = 0; b < p.B; ++b) {
        // Lt consecutive positions of one sequence are contiguous in both layouts.
        const int64_t elems = p.Lt * row_elems;
        std::memcpy(at(dst, (b * p.T + r * p.Lt) * row_elems, es),
                    in + static_cast<size_t>(b * elems) * es, static_cast<size_t>(elems) * es);
      }
    }
  });
}

void heads_to_seq(const Tensor& x_heads, const Tensor& x_seq, HeadKind kind, bool accumulate,
                  const Tensor& staging, const UlyssesLayout& layout, Comm& comm,
                  Stream& stream) {
  check_args(x_seq, x_heads, kind, staging, layout, comm, "heads_to_seq");
  CpuStream& cpu = as_cpu_stream(stream);
  const DType dt = x_seq.dtype();
  const size_t es = dtype_size(dt);
  auto plan = std::make_shared<const Plan>(make_plan(layout, kind));
  // Does any head have more than one holder? Only then does `accumulate` change anything.
  bool replicated = false;
  for (int r = 1; r < plan->world; ++r) {
    if (plan->begin[r] < plan->begin[r - 1] + plan->count[r - 1]) replicated = true;
  }
  const bool sum = accumulate && replicated;
  if (sum) {
    // Checked here, on the caller's thread, so an unsupported dtype throws at the call.
    ops::dispatch_float(dt, "heads_to_seq (accumulate)", [](auto) {});
  }
  void* send = staging.data();
  void* recv = at(staging.data(), plan->narrow_total, es);
  const void* src = x_heads.data();
  void* dst = x_seq.data();

  // Pack: block p = positions [p*Lt, (p+1)*Lt) of every sequence, this rank's heads.
  cpu.enqueue([plan, src, send, es] {
    const Plan& p = *plan;
    const int64_t row_elems = p.count[p.me] * p.d, elems = p.Lt * row_elems;
    for (int r = 0; r < p.world; ++r) {
      char* out = at(send, static_cast<int64_t>(p.narrow_offsets[r]), es);
      for (int64_t b = 0; b < p.B; ++b) {
        std::memcpy(out + static_cast<size_t>(b * elems) * es,
                    at(src, (b * p.T + r * p.Lt) * row_elems, es),
                    static_cast<size_t>(elems) * es);
      }
    }
  });
  comm.all_to_all_v(send, plan->narrow_counts, plan->narrow_offsets, recv, plan->wide_counts,
                    plan->wide_offsets, dt, stream);

  if (!sum) {
    // Each head from the lowest rank holding it: walk the ranks in order and copy the heads no
    // earlier rank covered (head ranges are contiguous and increasing in rank).
    cpu.enqueue([plan, recv, dst, es] {
      const Plan& p = *plan;
      int64_t next_head = 0;
      for (int r = 0; r < p.world; ++r) {
        const int64_t end = p.begin[r] + p.count[r];
        if (end <= next_head) continue;
        const int64_t first = std::max(next_head, p.begin[r]), n = end - first;
        const char* in = at(recv, static_cast<int64_t>(p.wide_offsets[r]), es);
        for (int64_t row = 0; row < p.B * p.Lt; ++row) {
          std::memcpy(at(dst, (row * p.h_total + first) * p.d, es),
                      in + static_cast<size_t>((row * p.count[r] + first - p.begin[r]) * p.d) * es,
                      static_cast<size_t>(n * p.d) * es);
        }
        next_head = end;
      }
    });
    return;
  }
  // Sum of the copies in increasing source rank: the first holder's copy, then += each next.
  ops::dispatch_float(dt, "heads_to_seq (accumulate)", [&](auto zero) {
    using T = decltype(zero);
    cpu.enqueue([plan, recv = static_cast<const T*>(recv), dst = static_cast<T*>(dst)] {
      const Plan& p = *plan;
      std::vector<bool> written(static_cast<size_t>(p.h_total), false);
      for (int r = 0; r < p.world; ++r) {
        const T* in = recv + p.wide_offsets[r];
        for (int64_t h = p.begin[r]; h < p.begin[r] + p.count[r]; ++h) {
          const bool first = !written[static_cast<size_t>(h)];
          written[static_cast<size_t>(h)] = true;
          for (int64_t row = 0; row < p.B * p.Lt; ++row) {
            const T* a = in + (row * p.count[r] + h - p.begin[r]) * p.d;
            T* o = dst + (row * p.h_total + h) * p.d;
            if (first) {
              for (int64_t i = 0; i < p.d; ++i) o[i] = a[i];
            } else {
              for (int64_t i = 0; i < p.d; ++i) o[i] += a[i];
            }
          }
        }
      }
    });
  });
}

}  // namespace moepeak::schedules
