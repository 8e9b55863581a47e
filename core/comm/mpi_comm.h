// MpiComm: the Comm of the CPU backend, over host buffers with OpenMPI.
//
// Each operation is enqueued on the given CPU stream (as_cpu_stream) and the MPI call runs on that
// stream's worker thread, so communication overlaps compute on other streams exactly as NCCL does
// on a GPU (hence MPI_THREAD_MULTIPLE). Arguments are checked when the operation is submitted (a
// bad peer or count throws right away on the calling thread); MPI errors raised while it runs
// become moepeak::Error carrying MPI's error string, surfacing at the stream's synchronize().
//
// Data types: f32, f64, i32, i64 map to MPI's; bf16 has no MPI type and is a 2-byte contiguous
// type with user-defined sum/max/min that compute in float and round back to bf16.
//
// 64-bit counts: MPI counts and displacements are int. Collectives whose count is above the
// per-call limit (INT_MAX elements; lowered in tests with set_max_elements_per_call) run in pieces:
// all_reduce / broadcast / send / recv / sendrecv in consecutive chunks; all_gather as one chunked
// broadcast per root; reduce_scatter as one chunked reduce per root. all_to_all_v always runs as
// nonblocking point-to-point messages per peer (chunked the same way), because its counts differ
// per rank and the choice between MPI_Alltoallv and a fallback could not be made alike everywhere;
// exchange likewise posts every message (chunked) at once and waits for all of them.
// A sent message must be received with the same count (as in NCCL).
//
// Link model (set_link_model, LinkModel in comm.h): with one set, every stream-ordered operation
// takes at least latency + bytes / bandwidth from when it starts on its stream, bytes being what
// this rank moves over the link for it — send / recv / sendrecv / exchange / all_to_all_v: the
// larger of its bytes out and in (other ranks only); all_gather: (W-1) blocks; reduce_scatter:
// (W-1) blocks; all_reduce: 2(W-1)/W of the buffer (a ring); broadcast: the buffer. Both ends of
// a transfer wait, so a rank cannot get ahead of the link by receiving early. Duplicates and
// splits inherit it. With LinkModel::poll_waits (runtime.cpu_comm_wait = "poll") every call is
// made non-blocking (MPI_Isend, MPI_Iallreduce, ...) and waited for with MPI_Testall between
// sleeps, so a comm thread waiting on its peers leaves its core to the compute threads (MPI's
// blocking calls spin); the collectives then run MPI's non-blocking algorithms, whose sums may
// be ordered differently from the blocking ones (each mode is deterministic on its own).
//
// Communicators: the constructor duplicates the parent communicator twice: one for stream-ordered
// traffic (used only by the stream worker threads) and one for host-side calls (barrier,
// duplicate), so a host barrier never races a collective still running on a stream. Both get
// MPI_ERRORS_RETURN. Destroy an MpiComm only after its streams have passed its operations; after
// MPI_Finalize the destructor leaves the handles alone.
//
// Test: ctest -R test_comm_mpi   (4 ranks under mpirun)
#pragma once

#include <mpi.h>

#include <climits>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/comm/comm.h"
#include "core/error.h"

namespace moepeak {

// MPI's text for an error code, e.g. "MPI_ERR_TRUNCATE: message truncated".
std::string mpi_error_string(int code);

// The MPI datatype of `dtype` (a committed 2-byte type for bf16).
MPI_Datatype mpi_datatype(DType dtype);
// The MPI reduction for `op` on `dtype` (user-defined ops for bf16).
MPI_Op mpi_reduce_op(ReduceOp op, DType dtype);

}  // namespace moepeak

// Turns a failing MPI call into moepeak::Error naming the call and MPI's error string. The
// communicator must have MPI_ERRORS_RETURN (the default handler aborts instead of returning).
#define MOEPEAK_MPI_CHECK(call)                                                                    \
  do {                                                                                             \
    int moepeak_mpi_code_ = (call);                                                                \
    if (moepeak_mpi_code_ != MPI_SUCCESS) {                                                        \
      MOEPEAK_THROW("MPI error in ", #call, ": ", ::moepeak::mpi_error_string(moepeak_mpi_code_)); \
    }                                                                                              \
  } while (0)

namespace moepeak {

// The RankInfo of this rank in `group`, a communicator split from one whose ranks `parent`
// describes: rank and size in the group, and local_rank / local_size among the group's ranks on
// this host (host unchanged). Collective over `group`.
RankInfo split_rank_info(MPI_Comm group, const RankInfo& parent);

class MpiComm final : public Comm {
 public:
  // Duplicates `parent` (collective over its ranks). `ranks` must agree with it: rank and world
  // size are checked. Throws when MPI is not initialised with MPI_THREAD_MULTIPLE.
  MpiComm(MPI_Comm parent, RankInfo ranks);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  std::string_view kind() const override { return "mpi"; }

  void all_to_all_v(const void* send, std::span<const size_t> send_counts,
                    std::span<const size_t> send_offsets, void* recv,
                    std::span<const size_t> recv_counts, std::span<const size_t> recv_offsets,
                    DType dtype, Stream& stream) override;
  void send(const void* buf, size_t count, DType dtype, int peer, Stream& stream) override;
  void recv(void* buf, size_t count, DType dtype, int peer, Stream& stream) override;
  void exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs, DType dtype,
                Stream& stream) override;
  void sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                int src, DType dtype, Stream& stream) override;
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  Stream& stream) override;
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                      Stream& stream) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  Stream& stream) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, Stream& stream) override;
  void barrier() override;
  void group_start() override;
  void group_end() override;
  std::unique_ptr<Comm> duplicate() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // The communicator the stream-ordered operations use (for code that needs a raw MPI call).
  MPI_Comm native() const { return comm_; }

  // Largest element count one MPI call is given; larger operations run in pieces. INT_MAX unless
  // a test lowers it to exercise the chunked paths with small buffers. Must be the same on all
  // ranks; set it before submitting operations.
  void set_max_elements_per_call(size_t max_elements);
  size_t max_elements_per_call() const { return max_elements_; }

  // Every operation submitted after this takes at least the link's time (see above).
  void set_link_model(const LinkModel& link);
  const LinkModel& link_model() const { return link_; }

 private:
  // Queues `op` on the CPU stream, padded to the link model's time for `wire_bytes` (inside a
  // group: adds it to the group's one task).
  // `label` names the operation for StreamProfile (core/runtime/stream_profile.h).
  void submit(Stream& stream, const char* label, double wire_bytes, std::function<void()> op);
  void enqueue(Stream& stream, const char* label, double wire_bytes, std::function<void()> op);
  struct OpenGroup {
    // NOTES: user-provided, so that std::optional<OpenGroup>::emplace() compiles under clang 14
    // (which does not see the member initializers before MpiComm is complete).
    OpenGroup() {}
    Stream* stream = nullptr;
    const char* label = nullptr;
    double wire_bytes = 0;
    std::vector<std::function<void()>> ops;
  };
  std::optional<OpenGroup> group_;
  // Shared with every queued task: a task that starts after the communicator is destroyed is
  // refused instead of calling MPI on a freed handle (an error unwinding past queued work).
  struct Lifetime {
    std::mutex mu;
    bool alive = true;
    int running = 0;  // tasks inside MPI now
  };
  std::shared_ptr<Lifetime> lifetime_ = std::make_shared<Lifetime>();
  MPI_Comm comm_ = MPI_COMM_NULL;       // stream-ordered traffic
  MPI_Comm host_comm_ = MPI_COMM_NULL;  // barrier() and duplicate() on the host thread
  size_t max_elements_ = INT_MAX;
  LinkModel link_;
};

}  // namespace moepeak
