// NcclComm: the Comm of the CUDA backend, over device buffers with NCCL (built only with
// MOEPEAK_WITH_CUDA).
//
// Bootstrap: rank 0 creates the ncclUniqueId and broadcasts it over MPI (together with a status
// word, so a failure on rank 0 is an Error on every rank instead of a hang); then
// ncclCommInitRank on the CUDA device that is current on the constructing thread (or the one
// given). Operations go to `static_cast<cudaStream_t>(stream.native_handle())` with that device
// made current for the call. all_to_all_v, sendrecv and exchange are ncclSend/ncclRecv inside
// ncclGroupStart/End; a rank's block to itself is a cudaMemcpyAsync. bf16 is ncclBfloat16.
// barrier() is MPI_Barrier on a private duplicate of the bootstrap communicator, after checking
// NCCL's asynchronous error state. duplicate() builds a second NcclComm from a fresh unique id
// (host-side, so it never waits behind traffic queued on the first).
//
// Like NCCL itself: buffers are device pointers of the same device; operations on one NcclComm
// are issued in the same order on every rank; one GPU per rank (NCCL rejects two ranks on one
// GPU, so on a single-GPU machine only a world of one can run).
//
// Test: ctest -L cuda   (test_comm_nccl; skips without a GPU)
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "core/comm/comm.h"
#include "core/error.h"

// Turns a failing NCCL call into moepeak::Error with NCCL's error string and last-error detail.
#define MOEPEAK_NCCL_CHECK(call)                                                                   \
  do {                                                                                             \
    ncclResult_t moepeak_nccl_status_ = (call);                                                    \
    if (moepeak_nccl_status_ != ncclSuccess) {                                                     \
      MOEPEAK_THROW("NCCL error in ", #call, ": ", ncclGetErrorString(moepeak_nccl_status_), " (", \
                    ncclGetLastError(nullptr), ")");                                               \
    }                                                                                              \
  } while (0)

namespace moepeak {

ncclDataType_t nccl_datatype(DType dtype);
ncclRedOp_t nccl_reduce_op(ReduceOp op);

class NcclComm final : public Comm {
 public:
  // Collective over `bootstrap` (MPI_COMM_WORLD in practice; may be MPI_COMM_NULL for a world of
  // one, which then needs no MPI). `device` -1 means the device current on this thread.
  NcclComm(RankInfo ranks, MPI_Comm bootstrap, int device = -1);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string_view kind() const override { return "nccl"; }
  int device() const { return device_; }
  ncclComm_t native() const { return comm_; }

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

 private:
  void check_async_error() const;

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  MPI_Comm host_comm_ = MPI_COMM_NULL;  // bootstrap of duplicate() and barrier()
};

}  // namespace moepeak
