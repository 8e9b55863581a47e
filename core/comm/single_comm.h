// SingleComm: the communicator of a world of one rank (no MPI, no NCCL).
//
// Every collective reduces over one rank, so each is a copy from send to recv in stream order
// (nothing at all when in place): a memcpy on a CPU stream's worker thread, or cudaMemcpyAsync
// on the CUDA stream. sendrecv to this rank itself is the same copy; send/recv to "itself"
// would wait forever for the matching call and are an Error (use sendrecv). Peers and roots other
// than 0 are an Error. barrier() returns at once.
//
// Test: ctest -R test_comm_single
#pragma once

#include "core/comm/comm.h"
#include "core/runtime/backend.h"

namespace moepeak {

class SingleComm final : public Comm {
 public:
  // `kind` selects how copies run: CPU stream tasks or cudaMemcpyAsync (only in CUDA builds).
  // `ranks` must be a world of one (the default: rank 0 of 1, local rank 0 of 1).
  explicit SingleComm(BackendKind kind, RankInfo ranks = {});

  std::string_view kind() const override { return "single"; }
  BackendKind backend_kind() const { return backend_kind_; }

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
  void barrier() override {}
  std::unique_ptr<Comm> duplicate() override;
  std::unique_ptr<Comm> split(int color, int key) override;

 private:
  // Copies `bytes` from src to dst in stream order; nothing when src == dst, an Error when the
  // ranges overlap otherwise.
  void copy(void* dst, const void* src, size_t bytes, Stream& stream);

  BackendKind backend_kind_;
};

}  // namespace moepeak
