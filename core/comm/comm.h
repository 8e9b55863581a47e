// Comm: collectives and point-to-point between the W rank processes of a job
// (docs/design.md#parallel-layout).
//
// Implementations: MPI (host buffers; the CPU backend), NCCL (device buffers of the CUDA
// backend; the unique id is broadcast over MPI), and a single-rank one (W = 1, plain copies).
//
// Every operation is submitted to a stream, as in NCCL: it runs in that stream's order and the
// buffers must stay alive until the stream has passed it. Counts are in elements of `dtype`.
// Like NCCL, operations on one communicator must be issued in the same order on every rank and
// never from two streams at once; a schedule that overlaps two kinds of traffic uses a second
// communicator from duplicate().
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/runtime/dtype.h"
#include "core/runtime/stream.h"

namespace moepeak {

class Backend;

enum class ReduceOp { sum, max, min };

std::string_view reduce_op_name(ReduceOp op);

// Who this process is in the job. Filled by init_process_group (core/comm/process_group.h).
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this host (selects the GPU and NUMA node)
  int local_size = 1;
  std::string host;
};

// One message of a batched exchange (Comm::exchange): `count` elements at `buf` to or from
// `peer` (a send's buffer is only read).
struct PeerMessage {
  void* buf = nullptr;
  size_t count = 0;
  int peer = 0;
};

// A link for communicators whose bytes move far faster than a cluster's network (MPI over
// shared memory on the CPU backend): each operation takes at least latency + bytes / bandwidth
// (MpiComm::set_link_model says which bytes), so whether a schedule hides its communication
// shows on any machine. bytes_per_s = latency_s = 0: off. runtime.cpu_link_gb_per_s and
// runtime.cpu_link_latency_us set it for a run (make_comm).
struct LinkModel {
  double bytes_per_s = 0;  // 0: no bandwidth limit
  double latency_s = 0;
  // Wait for MPI by testing with short sleeps instead of MPI's spinning blocking calls, so a
  // waiting comm thread leaves its core to compute (runtime.cpu_comm_wait = "poll").
  bool poll_waits = false;
  bool enabled() const { return bytes_per_s > 0 || latency_s > 0; }
  double seconds(double bytes) const {
    return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0.0);
  }
};

class Comm {
 public:
  virtual ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  virtual std::string_view kind() const = 0;  // "mpi", "nccl", "single"
  const RankInfo& ranks() const { return ranks_; }
  int rank() const { return ranks_.rank; }
  int world_size() const { return ranks_.world_size; }
  // What messages call this communicator ("world", "expert", "world/dup"): make_comm's is
  // "world", ParallelGroups names its groups; a duplicate or split is named after its parent
  // until renamed.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // Rank r sends send_counts[p] elements starting at send_offsets[p] to each peer p and receives
  // recv_counts[p] elements at recv_offsets[p] from each p. Spans have world_size entries.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_counts,
                            std::span<const size_t> send_offsets, void* recv,
                            std::span<const size_t> recv_counts,
                            std::span<const size_t> recv_offsets, DType dtype, Stream& stream) = 0;
  // Blocking in stream order until the matching call on the peer.
  virtual void send(const void* buf, size_t count, DType dtype, int peer, Stream& stream) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer, Stream& stream) = 0;
  // Send to `dst` and receive from `src` at once (a ring shift), without deadlock.
  virtual void sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                        int src, DType dtype, Stream& stream) = 0;
  // Every send and receive of the lists posted at once and completed together (NCCL: one group;
  // MPI: nonblocking, then a wait for all), so transfers to and from several peers overlap.
  // Messages between two ranks match in list order on each side; no order of the lists deadlocks.
  // A message to or from this rank itself is an Error (use sendrecv for a copy).
  virtual void exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs,
                        DType dtype, Stream& stream) = 0;
  // `send == recv` is in place.
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          Stream& stream) = 0;
  // `send` holds world_size * recv_count elements; rank r receives the reduction of block r.
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                              ReduceOp op, Stream& stream) = 0;
  // `recv` gets world_size * send_count elements, block r from rank r.
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                          Stream& stream) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, Stream& stream) = 0;
  // Host-blocking barrier across all ranks (not stream-ordered).
  virtual void barrier() = 0;

  // Operations issued between group_start() and group_end() go out as one launch (bucketing many
  // small tensors): NCCL's ncclGroupStart/End; on MPI one task on the stream that runs them in
  // the order issued, each exactly as it would run alone, which under a link model pays one
  // latency for all their bytes together; the single-rank Comm runs each as issued. Every
  // operation of a group goes to one stream; they complete together, and their buffers must live
  // as for each alone. Groups do not nest. CommGroup (below) opens and closes one.
  virtual void group_start() {}
  virtual void group_end() {}

  // A second communicator over the same ranks, for traffic that overlaps this one's.
  virtual std::unique_ptr<Comm> duplicate() = 0;

  // A communicator over the ranks that pass the same `color`, ranked by `key` (ties by this
  // communicator's rank): an expert-parallel or sequence-parallel group, or the replicas of one
  // shard. Collective over this communicator on the host thread: every rank calls it, in the
  // same order relative to its other collectives. The group's RankInfo counts its own members
  // (local_rank and local_size among the group's ranks on this host).
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

 protected:
  explicit Comm(RankInfo ranks);
  // Argument checks every implementation makes on the calling thread, before any traffic.
  void check_peer(int peer, const char* what) const;
  // Every message's peer is another rank of the communicator.
  void check_exchange_args(std::span<const PeerMessage> sends,
                           std::span<const PeerMessage> recvs) const;
  void check_all_to_all_v_args(std::span<const size_t> send_counts,
                               std::span<const size_t> send_offsets,
                               std::span<const size_t> recv_counts,
                               std::span<const size_t> recv_offsets) const;
  RankInfo ranks_;
  std::string name_ = "world";
};

// How many communicators of more than one rank this process holds now (MPI's on the CPU
// backend, NCCL's on CUDA, where each keeps buffers on the GPU outside the arena; SingleComm is
// not one). The plan counts them with model_group_communicators (core/model/decoder_memory.h)
// for its NCCL term.
int live_group_communicators();

// One Comm group for a scope: group_start() now, group_end() at end() or, on an error path, in
// the destructor (whose own error is dropped: the one in flight is the caller's).
class CommGroup {
 public:
  explicit CommGroup(Comm& comm) : comm_(&comm) { comm_->group_start(); }
  ~CommGroup() {
    if (!comm_) return;
    try {
      comm_->group_end();
    } catch (...) {
    }
  }
  void end() {
    Comm* comm = comm_;
    comm_ = nullptr;
    comm->group_end();
  }
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;

 private:
  Comm* comm_;
};

// The communicator for `backend` over the ranks of init_process_group(): a world of one gets the
// single-rank Comm; otherwise the CPU backend gets MPI and the CUDA backend NCCL (bootstrapped
// over MPI_COMM_WORLD; the rank's GPU must be current). Collective: every rank calls it. `link`:
// the CPU backend's link model (MpiComm::set_link_model); NCCL's links are real and a world of
// one has none, so both ignore it.
std::unique_ptr<Comm> make_comm(Backend& backend, const RankInfo& ranks,
                                const LinkModel& link = {});

// A few host doubles through a collective (a step's loss, squared grad norm, metrics): copied
// into a device buffer of `backend` (LiveSet::workspace), reduced or gathered on `stream`,
// copied back. Synchronises the stream. Not for bulk data.
void all_reduce_host(Comm& comm, Backend& backend, Stream& stream, std::span<double> values,
                     ReduceOp op = ReduceOp::sum);
// Every rank's `mine` (the same length on every rank), rank-major: W * mine.size() values.
std::vector<double> all_gather_host(Comm& comm, Backend& backend, Stream& stream,
                                    std::span<const double> mine);

}  // namespace moepeak
