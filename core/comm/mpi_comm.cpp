// MpiComm: Comm over OpenMPI for host buffers, each operation run on a CPU stream's worker thread
// (see mpi_comm.h for the design: chunking above INT_MAX, bf16, the two communicators).
// Test: ctest -R test_comm_mpi
#include "core/comm/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/watchdog.h"
#include "core/fault_injection.h"
#include "core/runtime/cpu_stream.h"
#include "core/runtime/stream_profile.h"

namespace moepeak {

namespace {

// The link model's bytes of an all_to_all_v: the larger of what this rank sends to and receives
// from the others (its own block is a local copy).
double wire_bytes_all_to_all(const std::vector<size_t>& send_counts,
                             const std::vector<size_t>& recv_counts, int me, size_t es) {
  size_t out = 0, in = 0;
  for (size_t p = 0; p < send_counts.size(); ++p) {
    if (static_cast<int>(p) == me) continue;
    out += send_counts[p];
    in += recv_counts[p];
  }
  return static_cast<double>(std::max(out, in) * es);
}

double wire_bytes_exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs,
                           size_t es) {
  size_t out = 0, in = 0;
  for (const PeerMessage& m : sends) out += m.count;
  for (const PeerMessage& m : recvs) in += m.count;
  return static_cast<double>(std::max(out, in) * es);
}

// One tag for every point-to-point message (send/recv, sendrecv, all_to_all_v), so a send()
// matches a sendrecv() on the peer as ncclSend matches ncclRecv. Messages of one operation
// arrive in order (MPI's non-overtaking rule), and operations on a communicator run one at a
// time in the same order on every rank.
constexpr int kPointToPointTag = 7;

// ---- bf16: a 2-byte type and reductions computed in float ------------------------------------

template <typename Combine>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  Combine combine;
  for (int i = 0; i < *len; ++i) {
    b[i] = bf16::from_float(combine(bf16::to_float(a[i]), bf16::to_float(b[i])));
  }
}
struct SumF {
  float operator()(float x, float y) const { return x + y; }
};
struct MaxF {
  float operator()(float x, float y) const { return std::max(x, y); }
};
struct MinF {
  float operator()(float x, float y) const { return std::min(x, y); }
};

struct Bf16Mpi {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};
Bf16Mpi g_bf16;
std::once_flag g_bf16_once;

// Runs at the start of MPI_Finalize (attributes on MPI_COMM_SELF are deleted first).
int free_bf16_at_finalize(MPI_Comm, int, void*, void*) {
  MPI_Op_free(&g_bf16.sum);
  MPI_Op_free(&g_bf16.max);
  MPI_Op_free(&g_bf16.min);
  MPI_Type_free(&g_bf16.type);
  return MPI_SUCCESS;
}

const Bf16Mpi& bf16_mpi() {
  std::call_once(g_bf16_once, [] {
    MOEPEAK_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_bf16.type));
    MOEPEAK_MPI_CHECK(MPI_Type_commit(&g_bf16.type));
    MOEPEAK_MPI_CHECK(MPI_Op_create(&bf16_reduce<SumF>, /*commute=*/1, &g_bf16.sum));
    MOEPEAK_MPI_CHECK(MPI_Op_create(&bf16_reduce<MaxF>, 1, &g_bf16.max));
    MOEPEAK_MPI_CHECK(MPI_Op_create(&bf16_reduce<MinF>, 1, &g_bf16.min));
    int keyval = MPI_KEYVAL_INVALID;
    MOEPEAK_MPI_CHECK(
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_bf16_at_finalize, &keyval, nullptr));
    MOEPEAK_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
  });
  return g_bf16;
}

// ---- helpers ---------------------------------------------------------------------------------

const char* at(const void* base, size_t elements, size_t element_size) {
  return static_cast<const char*>(base) + elements * element_size;
}
char* at(void* base, size_t elements, size_t element_size) {
  return static_cast<char*>(base) + elements * element_size;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// Calls fn(offset, n) for consecutive pieces of at most max_elements (none when count is 0).
template <typename Fn>
void for_each_chunk(size_t count, size_t max_elements, Fn&& fn) {
  for (size_t offset = 0; offset < count; offset += max_elements) {
    fn(offset, static_cast<int>(std::min(max_elements, count - offset)));
  }
}

size_t chunk_count(size_t count, size_t max_elements) {
  return (count + max_elements - 1) / max_elements;
}

// A posted receive and what it must deliver, checked once it has completed.
struct ExpectedRecv {
  size_t request_index;
  int peer;
  int count;
};

// Whether the operation running on this thread waits by polling (LinkModel::poll_waits), set
// for the length of each stream task by MpiComm::enqueue.
thread_local bool t_poll_waits = false;

// MPI_Waitall, or under poll_waits MPI_Testall between short sleeps: the thread then gives its
// core to the compute threads while its peers catch up, where MPI's own wait would spin.
int complete_all(int n, MPI_Request* requests, MPI_Status* statuses) {
  if (!t_poll_waits) return MPI_Waitall(n, requests, statuses);
  // NOTES: the nap doubles from 10 us to 200 us, so a long wait costs ~5 wake-ups per ms and a
  // finished operation is seen at most 200 us late (each test also progresses the transfers).
  std::chrono::microseconds nap(10);
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(n, requests, &done, statuses);
    if (rc != MPI_SUCCESS || done) return rc;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

// One MPI operation to completion: `blocking()` makes MPI's blocking call; under poll_waits
// `start(&request)` makes its non-blocking twin, which is then waited for by polling (its
// status into `status` when given; `blocking` fills it itself).
template <typename Blocking, typename Start>
void run_op(Blocking&& blocking, Start&& start, MPI_Status* status = nullptr) {
  if (!t_poll_waits) {
    blocking();
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  start(&request);
  MPI_Status ignored;
  MOEPEAK_MPI_CHECK(complete_all(1, &request, status ? status : &ignored));
}

// Waits for all requests; raises the first failed request's error, then any received message
// whose length differs from what the receiver expected (a sender/receiver count mismatch).
void wait_all(std::vector<MPI_Request>& requests, const std::vector<ExpectedRecv>& expected,
              MPI_Datatype type, const char* op_name) {
  if (requests.empty()) return;
  std::vector<MPI_Status> statuses(requests.size());
  int rc = complete_all(static_cast<int>(requests.size()), requests.data(), statuses.data());
  if (rc == MPI_ERR_IN_STATUS) {
    for (const MPI_Status& s : statuses) {
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
        MOEPEAK_THROW("MPI error in ", op_name, ": ", mpi_error_string(s.MPI_ERROR));
      }
    }
  }
  if (rc != MPI_SUCCESS) MOEPEAK_THROW("MPI error in ", op_name, ": ", mpi_error_string(rc));
  for (const ExpectedRecv& e : expected) {
    int got = 0;
    MOEPEAK_MPI_CHECK(MPI_Get_count(&statuses[e.request_index], type, &got));
    if (got != e.count) {
      MOEPEAK_THROW(op_name, ": received ", got, " elements from rank ", e.peer, " where ", e.count,
                    " were expected (sender and receiver counts must match)");
    }
  }
}

// Posts the chunked receives of `count` elements from `peer` into `buf`.
void post_recv(void* buf, size_t count, size_t element_size, int peer, MPI_Datatype type,
               MPI_Comm comm, size_t max_elements, std::vector<MPI_Request>& requests,
               std::vector<ExpectedRecv>& expected) {
  for_each_chunk(count, max_elements, [&](size_t offset, int n) {
    requests.emplace_back();
    expected.push_back({requests.size() - 1, peer, n});
    MOEPEAK_MPI_CHECK(MPI_Irecv(at(buf, offset, element_size), n, type, peer, kPointToPointTag,
                                comm, &requests.back()));
  });
}

void post_send(const void* buf, size_t count, size_t element_size, int peer, MPI_Datatype type,
               MPI_Comm comm, size_t max_elements, std::vector<MPI_Request>& requests) {
  for_each_chunk(count, max_elements, [&](size_t offset, int n) {
    requests.emplace_back();
    MOEPEAK_MPI_CHECK(MPI_Isend(at(buf, offset, element_size), n, type, peer, kPointToPointTag,
                                comm, &requests.back()));
  });
}

void check_received(const MPI_Status& status, MPI_Datatype type, int expected, int peer,
                    const char* op_name) {
  int got = 0;
  MOEPEAK_MPI_CHECK(MPI_Get_count(&status, type, &got));
  if (got != expected) {
    MOEPEAK_THROW(op_name, ": received ", got, " elements from rank ", peer, " where ", expected,
                  " were expected (sender and receiver counts must match)");
  }
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "unknown MPI error code " + std::to_string(code);
  }
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return std::string(text, static_cast<size_t>(length)) + " (MPI error class " +
         std::to_string(error_class) + ")";
}

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return bf16_mpi().type;
  }
  MOEPEAK_THROW("no MPI datatype for dtype ", static_cast<int>(dtype));
}

MPI_Op mpi_reduce_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16) {
    const Bf16Mpi& b = bf16_mpi();
    switch (op) {
      case ReduceOp::sum:
        return b.sum;
      case ReduceOp::max:
        return b.max;
      case ReduceOp::min:
        return b.min;
    }
  }
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  MOEPEAK_THROW("unknown reduce op ", static_cast<int>(op));
}

// ---- MpiComm ---------------------------------------------------------------------------------

MpiComm::MpiComm(MPI_Comm parent, RankInfo ranks) : Comm(std::move(ranks)) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    MOEPEAK_THROW(
        "MpiComm needs MPI to be initialised (init_process_group() under mpirun or "
        "srun); MPI is ",
        finalized ? "already finalised" : "not initialised");
  }
  int provided = MPI_THREAD_SINGLE;
  MOEPEAK_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    MOEPEAK_THROW(
        "MpiComm runs MPI calls on several stream threads and needs "
        "MPI_THREAD_MULTIPLE; the MPI library provides level ",
        provided);
  }
  int parent_rank = -1, parent_size = -1;
  MOEPEAK_MPI_CHECK(MPI_Comm_rank(parent, &parent_rank));
  MOEPEAK_MPI_CHECK(MPI_Comm_size(parent, &parent_size));
  if (parent_rank != ranks_.rank || parent_size != ranks_.world_size) {
    MOEPEAK_THROW("MpiComm: RankInfo says rank ", ranks_.rank, " of ", ranks_.world_size,
                  " but the MPI communicator has rank ", parent_rank, " of ", parent_size);
  }
  MOEPEAK_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MOEPEAK_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MOEPEAK_MPI_CHECK(MPI_Comm_dup(parent, &host_comm_));
  MOEPEAK_MPI_CHECK(MPI_Comm_set_errhandler(host_comm_, MPI_ERRORS_RETURN));
  bf16_mpi();  // create the bf16 type and ops now, not first on a stream thread
}

MpiComm::~MpiComm() {
  bool in_use;
  {
    std::lock_guard<std::mutex> lock(lifetime_->mu);
    lifetime_->alive = false;
    in_use = lifetime_->running > 0;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // NOTES: a task still inside MPI (its peers never came: this rank is unwinding an error, and
  // cli/ aborts the job next) keeps using comm_, so comm_ is left to MPI_Abort/MPI_Finalize.
  if (comm_ != MPI_COMM_NULL && !in_use) MPI_Comm_free(&comm_);
  if (host_comm_ != MPI_COMM_NULL) MPI_Comm_free(&host_comm_);
}

void MpiComm::submit(Stream& stream, const char* label, double wire_bytes,
                     std::function<void()> op) {
  if (group_) {
    MOEPEAK_CHECK(group_->stream == nullptr || group_->stream == &stream,
                  "a Comm group's operations go to one stream, not '", group_->stream->name(),
                  "' and '", stream.name(), "'");
    group_->stream = &stream;
    if (group_->label == nullptr) group_->label = label;  // a group is named by its first op
    group_->wire_bytes += wire_bytes;
    group_->ops.push_back(std::move(op));
    return;
  }
  enqueue(stream, label, wire_bytes, std::move(op));
}

void MpiComm::group_start() {
  MOEPEAK_CHECK(!group_, "Comm::group_start: a group is already open (groups do not nest)");
  group_.emplace();
}

void MpiComm::group_end() {
  MOEPEAK_CHECK(group_, "Comm::group_end without group_start");
  OpenGroup group = std::move(*group_);
  group_.reset();
  if (group.ops.empty()) return;
  enqueue(*group.stream, group.label, group.wire_bytes, [ops = std::move(group.ops)] {
    for (const std::function<void()>& op : ops) op();
  });
}

void MpiComm::enqueue(Stream& stream, const char* label, double wire_bytes,
                      std::function<void()> op_body) {
  const StreamOpLabel op_label(label);  // StreamProfile tells communication from compute
  std::function<void()> op = [lifetime = lifetime_, label, poll = link_.poll_waits, name = name_,
                              rank = rank(), size = world_size(), body = std::move(op_body)] {
    {
      std::lock_guard<std::mutex> lock(lifetime->mu);
      if (!lifetime->alive) {
        MOEPEAK_THROW("Comm ", label,
                      ": the communicator was destroyed with this operation still queued on its "
                      "stream");
      }
      ++lifetime->running;
    }
    struct Leave {
      Lifetime& l;
      ~Leave() {
        std::lock_guard<std::mutex> lock(l.mu);
        --l.running;
      }
    } leave{*lifetime};
    t_poll_waits = poll;
    fault_here("collective");  // tests/faults: a rank killed or delayed inside a collective
    const CollectiveWatch watch(label, name, rank, size);
    body();
  };
  const LinkModel link = link_;
  if (!link.enabled()) {
    as_cpu_stream(stream).enqueue(std::move(op));
    return;
  }
  // NOTES: the clock starts when the operation starts on its stream (not when it is queued), so
  // a transfer queued behind compute on the same stream is not credited with that time.
  as_cpu_stream(stream).enqueue([link, wire_bytes, op = std::move(op)] {
    const auto start = std::chrono::steady_clock::now();
    note_task_link_seconds(link.seconds(wire_bytes));
    op();
    std::this_thread::sleep_until(start +
                                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(link.seconds(wire_bytes))));
  });
}

void MpiComm::set_link_model(const LinkModel& link) {
  MOEPEAK_CHECK(link.bytes_per_s >= 0 && link.latency_s >= 0,
                "a link model needs bandwidth and latency >= 0, not ", link.bytes_per_s,
                " B/s and ", link.latency_s, " s");
  link_ = link;
}

void MpiComm::set_max_elements_per_call(size_t max_elements) {
  MOEPEAK_CHECK(max_elements >= 1 && max_elements <= static_cast<size_t>(INT_MAX),
                "max elements per MPI call must be in [1, INT_MAX], got ", max_elements);
  max_elements_ = max_elements;
}

void MpiComm::all_to_all_v(const void* send, std::span<const size_t> send_counts,
                           std::span<const size_t> send_offsets, void* recv,
                           std::span<const size_t> recv_counts,
                           std::span<const size_t> recv_offsets, DType dtype, Stream& stream) {
  check_all_to_all_v_args(send_counts, send_offsets, recv_counts, recv_offsets);
  const size_t world = static_cast<size_t>(world_size());
  const int me = rank();
  // The spans may not outlive this call: the stream task keeps copies.
  std::vector<size_t> sc(send_counts.begin(), send_counts.end());
  std::vector<size_t> so(send_offsets.begin(), send_offsets.end());
  std::vector<size_t> rc(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> ro(recv_offsets.begin(), recv_offsets.end());
  const size_t es = dtype_size(dtype);
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = wire_bytes_all_to_all(sc, rc, me, es);
  submit(stream, "all_to_all_v", wire,
         [=, comm = comm_, max = max_elements_, sc = std::move(sc), so = std::move(so),
          rc = std::move(rc), ro = std::move(ro)] {
           std::vector<MPI_Request> requests;
           std::vector<ExpectedRecv> expected;
           const int w = static_cast<int>(world);
           // Peers in ring order from this rank, so not every rank talks to rank 0 first.
           for (int step = 1; step < w; ++step) {
             int from = (me - step + w) % w;
             post_recv(at(recv, ro[from], es), rc[from], es, from, type, comm, max, requests,
                       expected);
           }
           for (int step = 1; step < w; ++step) {
             int to = (me + step) % w;
             post_send(at(send, so[to], es), sc[to], es, to, type, comm, max, requests);
           }
           if (sc[me] > 0) std::memmove(at(recv, ro[me], es), at(send, so[me], es), sc[me] * es);
           wait_all(requests, expected, type, "all_to_all_v");
         });
}

void MpiComm::send(const void* buf, size_t count, DType dtype, int peer, Stream& stream) {
  check_peer(peer, "send");
  MOEPEAK_CHECK(peer != rank(), "send to this rank itself (", peer,
                ") would block forever; use sendrecv for a copy to self");
  if (count == 0) return;
  const size_t es = dtype_size(dtype);
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = static_cast<double>(count * es);
  submit(stream, "send", wire, [=, comm = comm_, max = max_elements_] {
    for_each_chunk(count, max, [&](size_t offset, int n) {
      const void* piece = at(buf, offset, es);
      run_op([&] { MOEPEAK_MPI_CHECK(MPI_Send(piece, n, type, peer, kPointToPointTag, comm)); },
             [&](MPI_Request* r) {
               MOEPEAK_MPI_CHECK(MPI_Isend(piece, n, type, peer, kPointToPointTag, comm, r));
             });
    });
  });
}

void MpiComm::recv(void* buf, size_t count, DType dtype, int peer, Stream& stream) {
  check_peer(peer, "recv");
  MOEPEAK_CHECK(peer != rank(), "recv from this rank itself (", peer,
                ") would block forever; use sendrecv for a copy to self");
  if (count == 0) return;
  const size_t es = dtype_size(dtype);
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = static_cast<double>(count * es);
  submit(stream, "recv", wire, [=, comm = comm_, max = max_elements_] {
    for_each_chunk(count, max, [&](size_t offset, int n) {
      MPI_Status status;
      void* piece = at(buf, offset, es);
      run_op(
          [&] {
            MOEPEAK_MPI_CHECK(MPI_Recv(piece, n, type, peer, kPointToPointTag, comm, &status));
          },
          [&](MPI_Request* r) {
            MOEPEAK_MPI_CHECK(MPI_Irecv(piece, n, type, peer, kPointToPointTag, comm, r));
          },
          &status);
      check_received(status, type, n, peer, "recv");
    });
  });
}

void MpiComm::sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                       int src, DType dtype, Stream& stream) {
  check_peer(dst, "sendrecv (destination)");
  check_peer(src, "sendrecv (source)");
  const size_t es = dtype_size(dtype);
  if (dst == rank() || src == rank()) {
    MOEPEAK_CHECK(dst == src && send_count == recv_count, "sendrecv on rank ", rank(),
                  ": a message to itself needs dst == src == this rank and equal counts (dst ", dst,
                  ", src ", src, ", send ", send_count, ", recv ", recv_count, ")");
    if (send_count == 0 || send == recv) return;
    as_cpu_stream(stream).enqueue([=] { std::memmove(recv, send, send_count * es); });
    return;
  }
  if (send_count == 0 && recv_count == 0) return;
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = static_cast<double>(std::max(send_count, recv_count) * es);
  submit(stream, "sendrecv", wire, [=, comm = comm_, max = max_elements_] {
    std::vector<MPI_Request> requests;
    std::vector<ExpectedRecv> expected;
    requests.reserve(chunk_count(send_count, max) + chunk_count(recv_count, max));
    post_recv(recv, recv_count, es, src, type, comm, max, requests, expected);
    post_send(send, send_count, es, dst, type, comm, max, requests);
    wait_all(requests, expected, type, "sendrecv");
  });
}

void MpiComm::exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs,
                       DType dtype, Stream& stream) {
  check_exchange_args(sends, recvs);
  if (sends.empty() && recvs.empty()) return;
  const size_t es = dtype_size(dtype);
  MPI_Datatype type = mpi_datatype(dtype);
  std::vector<PeerMessage> to(sends.begin(), sends.end()), from(recvs.begin(), recvs.end());
  const double wire = wire_bytes_exchange(sends, recvs, es);
  submit(stream, "exchange", wire, [=, comm = comm_, max = max_elements_] {
    std::vector<MPI_Request> requests;
    std::vector<ExpectedRecv> expected;
    for (const PeerMessage& m : from) {
      post_recv(m.buf, m.count, es, m.peer, type, comm, max, requests, expected);
    }
    for (const PeerMessage& m : to) {
      post_send(m.buf, m.count, es, m.peer, type, comm, max, requests);
    }
    wait_all(requests, expected, type, "exchange");
  });
}

void MpiComm::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream& stream) {
  const size_t es = dtype_size(dtype);
  const bool in_place = send == recv;
  MOEPEAK_CHECK(in_place || !overlaps(send, count * es, recv, count * es),
                "all_reduce: send and recv buffers overlap without being the same (in place)");
  if (count == 0) return;
  MPI_Datatype type = mpi_datatype(dtype);
  MPI_Op mpi_op = mpi_reduce_op(op, dtype);
  const double wire = 2.0 * (world_size() - 1) / world_size() * static_cast<double>(count * es);
  submit(stream, "all_reduce", wire, [=, comm = comm_, max = max_elements_] {
    for_each_chunk(count, max, [&](size_t offset, int n) {
      const void* in = in_place ? MPI_IN_PLACE : at(send, offset, es);
      void* out = at(recv, offset, es);
      run_op([&] { MOEPEAK_MPI_CHECK(MPI_Allreduce(in, out, n, type, mpi_op, comm)); },
             [&](MPI_Request* r) {
               MOEPEAK_MPI_CHECK(MPI_Iallreduce(in, out, n, type, mpi_op, comm, r));
             });
    });
  });
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                             ReduceOp op, Stream& stream) {
  const size_t es = dtype_size(dtype);
  const int me = rank();
  const int world = world_size();
  // In place as in NCCL: recv is this rank's block of the send buffer.
  const bool in_place = recv == at(send, static_cast<size_t>(me) * recv_count, es);
  MOEPEAK_CHECK(in_place || !overlaps(send, world * recv_count * es, recv, recv_count * es),
                "reduce_scatter: recv overlaps send without being this rank's block of it "
                "(the in-place form)");
  if (recv_count == 0) return;
  MPI_Datatype type = mpi_datatype(dtype);
  MPI_Op mpi_op = mpi_reduce_op(op, dtype);
  const double wire = static_cast<double>((world - 1) * recv_count * es);
  submit(stream, "reduce_scatter", wire, [=, comm = comm_, max = max_elements_] {
    if (recv_count <= max) {
      if (in_place) {
        // MPI's in-place form reads the whole buffer and leaves the result at its start.
        void* whole = const_cast<void*>(send);
        const int n = static_cast<int>(recv_count);
        run_op(
            [&] {
              MOEPEAK_MPI_CHECK(
                  MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, n, type, mpi_op, comm));
            },
            [&](MPI_Request* r) {
              MOEPEAK_MPI_CHECK(
                  MPI_Ireduce_scatter_block(MPI_IN_PLACE, whole, n, type, mpi_op, comm, r));
            });
        if (me != 0) std::memmove(recv, whole, recv_count * es);
      } else {
        const int n = static_cast<int>(recv_count);
        run_op(
            [&] { MOEPEAK_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, type, mpi_op, comm)); },
            [&](MPI_Request* r) {
              MOEPEAK_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, type, mpi_op, comm, r));
            });
      }
      return;
    }
    // Above the per-call limit: one chunked reduce per root.
    for (int root = 0; root < world; ++root) {
      const size_t block = static_cast<size_t>(root) * recv_count;
      for_each_chunk(recv_count, max, [&](size_t offset, int n) {
        const void* in = (in_place && root == me) ? MPI_IN_PLACE : at(send, block + offset, es);
        void* out = root == me ? at(recv, offset, es) : nullptr;
        run_op([&] { MOEPEAK_MPI_CHECK(MPI_Reduce(in, out, n, type, mpi_op, root, comm)); },
               [&](MPI_Request* r) {
                 MOEPEAK_MPI_CHECK(MPI_Ireduce(in, out, n, type, mpi_op, root, comm, r));
               });
      });
    }
  });
}

void MpiComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                         Stream& stream) {
  const size_t es = dtype_size(dtype);
  const int me = rank();
  const int world = world_size();
  void* my_block = at(recv, static_cast<size_t>(me) * send_count, es);
  // In place as in NCCL (and MPI): send is this rank's block of the recv buffer.
  const bool in_place = send == my_block;
  MOEPEAK_CHECK(in_place || !overlaps(send, send_count * es, recv, world * send_count * es),
                "all_gather: send overlaps recv without being this rank's block of it "
                "(the in-place form)");
  if (send_count == 0) return;
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = static_cast<double>((world - 1) * send_count * es);
  submit(stream, "all_gather", wire, [=, comm = comm_, max = max_elements_] {
    if (send_count <= max) {
      const void* in = in_place ? MPI_IN_PLACE : send;
      const int n = static_cast<int>(send_count);
      run_op([&] { MOEPEAK_MPI_CHECK(MPI_Allgather(in, n, type, recv, n, type, comm)); },
             [&](MPI_Request* r) {
               MOEPEAK_MPI_CHECK(MPI_Iallgather(in, n, type, recv, n, type, comm, r));
             });
      return;
    }
    // Above the per-call limit: every rank broadcasts its block in chunks.
    if (!in_place) std::memcpy(my_block, send, send_count * es);
    for (int root = 0; root < world; ++root) {
      const size_t block = static_cast<size_t>(root) * send_count;
      for_each_chunk(send_count, max, [&](size_t offset, int n) {
        void* piece = at(recv, block + offset, es);
        run_op(
            [&] { MOEPEAK_MPI_CHECK(MPI_Bcast(piece, n, type, root, comm)); },
            [&](MPI_Request* r) { MOEPEAK_MPI_CHECK(MPI_Ibcast(piece, n, type, root, comm, r)); });
      });
    }
  });
}

void MpiComm::broadcast(void* buf, size_t count, DType dtype, int root, Stream& stream) {
  check_peer(root, "broadcast (root)");
  if (count == 0) return;
  const size_t es = dtype_size(dtype);
  MPI_Datatype type = mpi_datatype(dtype);
  const double wire = static_cast<double>(count * es);
  submit(stream, "broadcast", wire, [=, comm = comm_, max = max_elements_] {
    for_each_chunk(count, max, [&](size_t offset, int n) {
      void* piece = at(buf, offset, es);
      run_op([&] { MOEPEAK_MPI_CHECK(MPI_Bcast(piece, n, type, root, comm)); },
             [&](MPI_Request* r) { MOEPEAK_MPI_CHECK(MPI_Ibcast(piece, n, type, root, comm, r)); });
    });
  });
}

void MpiComm::barrier() {
  const CollectiveWatch watch("barrier", name_, rank(), world_size());
  MOEPEAK_MPI_CHECK(MPI_Barrier(host_comm_));
}

RankInfo split_rank_info(MPI_Comm group, const RankInfo& parent) {
  RankInfo info = parent;
  MOEPEAK_MPI_CHECK(MPI_Comm_rank(group, &info.rank));
  MOEPEAK_MPI_CHECK(MPI_Comm_size(group, &info.world_size));
  MPI_Comm local = MPI_COMM_NULL;
  MOEPEAK_MPI_CHECK(
      MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local));
  MOEPEAK_MPI_CHECK(MPI_Comm_rank(local, &info.local_rank));
  MOEPEAK_MPI_CHECK(MPI_Comm_size(local, &info.local_size));
  MPI_Comm_free(&local);
  return info;
}

std::unique_ptr<Comm> MpiComm::split(int color, int key) {
  MOEPEAK_CHECK(color >= 0, "Comm::split: color ", color, " must be >= 0");
  MPI_Comm group = MPI_COMM_NULL;
  MOEPEAK_MPI_CHECK(MPI_Comm_split(host_comm_, color, key, &group));
  auto sub = std::make_unique<MpiComm>(group, split_rank_info(group, ranks_));
  sub->max_elements_ = max_elements_;
  sub->link_ = link_;
  sub->set_name(name_ + "/split");
  MPI_Comm_free(&group);  // the new communicator keeps its own duplicates
  return sub;
}

std::unique_ptr<Comm> MpiComm::duplicate() {
  auto copy = std::make_unique<MpiComm>(host_comm_, ranks_);
  copy->max_elements_ = max_elements_;
  copy->link_ = link_;
  copy->set_name(name_ + "/dup");
  return copy;
}

}  // namespace moepeak
