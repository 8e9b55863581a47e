// NcclComm: Comm over NCCL for device buffers of the CUDA backend (see nccl_comm.h).
// Compiled only with MOEPEAK_WITH_CUDA. Test: ctest -L cuda (skips without a GPU).
#include "core/comm/nccl_comm.h"

#include <cstdint>

#include "core/comm/mpi_comm.h"
#include "core/runtime/cuda_check.h"

namespace moepeak {

namespace {

// Makes `device` current for the lifetime of the guard and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MOEPEAK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      MOEPEAK_CUDA_CHECK(cudaSetDevice(device));
      restore_ = true;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// ncclGroupStart/End that is closed even when a call inside the group throws.
class NcclGroup {
 public:
  NcclGroup() { MOEPEAK_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  void end() {
    open_ = false;
    MOEPEAK_NCCL_CHECK(ncclGroupEnd());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = true;
};

cudaStream_t cuda_stream(Stream& stream) {
  // CUDA streams are created non-blocking and are never null; a null handle is a CPU stream.
  MOEPEAK_CHECK(stream.native_handle() != nullptr, "stream '", stream.name(),
                "' is not a CUDA stream, but NCCL operations need one");
  return static_cast<cudaStream_t>(stream.native_handle());
}

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

void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  MOEPEAK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// What rank 0 broadcasts: whether it could create the id, and the id.
struct UniqueIdMessage {
  int status = ncclSuccess;
  ncclUniqueId id{};
};

}  // namespace

ncclDataType_t nccl_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  MOEPEAK_THROW("no NCCL datatype for dtype ", static_cast<int>(dtype));
}

ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  MOEPEAK_THROW("unknown reduce op ", static_cast<int>(op));
}

NcclComm::NcclComm(RankInfo ranks, MPI_Comm bootstrap, int device) : Comm(std::move(ranks)) {
  if (device < 0) {
    MOEPEAK_CUDA_CHECK(cudaGetDevice(&device_));
  } else {
    device_ = device;
  }
  const int world = world_size();
  if (bootstrap != MPI_COMM_NULL) {
    int boot_rank = -1, boot_size = -1;
    MOEPEAK_MPI_CHECK(MPI_Comm_rank(bootstrap, &boot_rank));
    MOEPEAK_MPI_CHECK(MPI_Comm_size(bootstrap, &boot_size));
    if (boot_rank != rank() || boot_size != world) {
      MOEPEAK_THROW("NcclComm: RankInfo says rank ", rank(), " of ", world,
                    " but the MPI bootstrap communicator has rank ", boot_rank, " of ", boot_size);
    }
    MOEPEAK_MPI_CHECK(MPI_Comm_dup(bootstrap, &host_comm_));
    MOEPEAK_MPI_CHECK(MPI_Comm_set_errhandler(host_comm_, MPI_ERRORS_RETURN));
  } else if (world > 1) {
    MOEPEAK_THROW("NcclComm for ", world,
                  " ranks needs an MPI communicator to share the NCCL "
                  "unique id (init_process_group() under mpirun or srun)");
  }
  try {
    UniqueIdMessage message;
    if (rank() == 0) message.status = ncclGetUniqueId(&message.id);
    if (world > 1) {
      MOEPEAK_MPI_CHECK(MPI_Bcast(&message, sizeof(message), MPI_BYTE, /*root=*/0, host_comm_));
    }
    if (message.status != ncclSuccess) {
      MOEPEAK_THROW("rank 0 could not create the NCCL unique id: ",
                    ncclGetErrorString(static_cast<ncclResult_t>(message.status)));
    }
    DeviceGuard guard(device_);
    MOEPEAK_NCCL_CHECK(ncclCommInitRank(&comm_, world, message.id, rank()));
  } catch (...) {
    if (host_comm_ != MPI_COMM_NULL) MPI_Comm_free(&host_comm_);
    throw;
  }
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) {
    int previous = 0;
    bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                    cudaSetDevice(device_) == cudaSuccess;
    ncclCommDestroy(comm_);  // finalises (flushes issued operations) first
    if (switched) cudaSetDevice(previous);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && host_comm_ != MPI_COMM_NULL) MPI_Comm_free(&host_comm_);
}

void NcclComm::check_async_error() const {
  ncclResult_t async_error = ncclSuccess;
  MOEPEAK_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async_error));
  if (async_error != ncclSuccess) {
    MOEPEAK_THROW("NCCL communicator failed asynchronously: ", ncclGetErrorString(async_error),
                  " (", ncclGetLastError(comm_), ")");
  }
}

void NcclComm::all_to_all_v(const void* send, std::span<const size_t> send_counts,
                            std::span<const size_t> send_offsets, void* recv,
                            std::span<const size_t> recv_counts,
                            std::span<const size_t> recv_offsets, DType dtype, Stream& stream) {
  check_all_to_all_v_args(send_counts, send_offsets, recv_counts, recv_offsets);
  const size_t world = static_cast<size_t>(world_size());
  const int me = rank();
  const size_t es = dtype_size(dtype);
  const ncclDataType_t type = nccl_datatype(dtype);
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  copy_on_device(at(recv, recv_offsets[me], es), at(send, send_offsets[me], es),
                 send_counts[me] * es, s);
  NcclGroup group;
  for (size_t peer = 0; peer < world; ++peer) {
    if (static_cast<int>(peer) == me) continue;
    if (send_counts[peer] > 0) {
      MOEPEAK_NCCL_CHECK(ncclSend(at(send, send_offsets[peer], es), send_counts[peer], type,
                                  static_cast<int>(peer), comm_, s));
    }
    if (recv_counts[peer] > 0) {
      MOEPEAK_NCCL_CHECK(ncclRecv(at(recv, recv_offsets[peer], es), recv_counts[peer], type,
                                  static_cast<int>(peer), comm_, s));
    }
  }
  group.end();
}

void NcclComm::send(const void* buf, size_t count, DType dtype, int peer, Stream& stream) {
  check_peer(peer, "send");
  MOEPEAK_CHECK(peer != rank(), "send to this rank itself (", peer,
                ") would block forever; use sendrecv for a copy to self");
  if (count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(ncclSend(buf, count, nccl_datatype(dtype), peer, comm_, s));
}

void NcclComm::recv(void* buf, size_t count, DType dtype, int peer, Stream& stream) {
  check_peer(peer, "recv");
  MOEPEAK_CHECK(peer != rank(), "recv from this rank itself (", peer,
                ") would block forever; use sendrecv for a copy to self");
  if (count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(ncclRecv(buf, count, nccl_datatype(dtype), peer, comm_, s));
}

void NcclComm::sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                        int src, DType dtype, Stream& stream) {
  check_peer(dst, "sendrecv (destination)");
  check_peer(src, "sendrecv (source)");
  const size_t es = dtype_size(dtype);
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  if (dst == rank() || src == rank()) {
    MOEPEAK_CHECK(dst == src && send_count == recv_count, "sendrecv on rank ", rank(),
                  ": a message to itself needs dst == src == this rank and equal counts (dst ", dst,
                  ", src ", src, ", send ", send_count, ", recv ", recv_count, ")");
    MOEPEAK_CHECK(send == recv || !overlaps(send, send_count * es, recv, recv_count * es),
                  "sendrecv to itself: send and recv overlap without being the same buffer");
    copy_on_device(recv, send, send_count * es, s);
    return;
  }
  if (send_count == 0 && recv_count == 0) return;
  const ncclDataType_t type = nccl_datatype(dtype);
  NcclGroup group;
  if (send_count > 0) MOEPEAK_NCCL_CHECK(ncclSend(send, send_count, type, dst, comm_, s));
  if (recv_count > 0) MOEPEAK_NCCL_CHECK(ncclRecv(recv, recv_count, type, src, comm_, s));
  group.end();
}

void NcclComm::exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs,
                        DType dtype, Stream& stream) {
  check_exchange_args(sends, recvs);
  if (sends.empty() && recvs.empty()) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  const ncclDataType_t type = nccl_datatype(dtype);
  NcclGroup group;
  for (const PeerMessage& m : sends) {
    if (m.count > 0) MOEPEAK_NCCL_CHECK(ncclSend(m.buf, m.count, type, m.peer, comm_, s));
  }
  for (const PeerMessage& m : recvs) {
    if (m.count > 0) MOEPEAK_NCCL_CHECK(ncclRecv(m.buf, m.count, type, m.peer, comm_, s));
  }
  group.end();
}

void NcclComm::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          Stream& stream) {
  const size_t es = dtype_size(dtype);
  MOEPEAK_CHECK(send == recv || !overlaps(send, count * es, recv, count * es),
                "all_reduce: send and recv buffers overlap without being the same (in place)");
  if (count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(
      ncclAllReduce(send, recv, count, nccl_datatype(dtype), nccl_reduce_op(op), comm_, s));
}

void NcclComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                              ReduceOp op, Stream& stream) {
  const size_t es = dtype_size(dtype);
  const size_t world = static_cast<size_t>(world_size());
  const bool in_place = recv == at(send, static_cast<size_t>(rank()) * recv_count, es);
  MOEPEAK_CHECK(in_place || !overlaps(send, world * recv_count * es, recv, recv_count * es),
                "reduce_scatter: recv overlaps send without being this rank's block of it "
                "(the in-place form)");
  if (recv_count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_datatype(dtype),
                                       nccl_reduce_op(op), comm_, s));
}

void NcclComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                          Stream& stream) {
  const size_t es = dtype_size(dtype);
  const size_t world = static_cast<size_t>(world_size());
  const bool in_place = send == at(recv, static_cast<size_t>(rank()) * send_count, es);
  MOEPEAK_CHECK(in_place || !overlaps(send, send_count * es, recv, world * send_count * es),
                "all_gather: send overlaps recv without being this rank's block of it "
                "(the in-place form)");
  if (send_count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_datatype(dtype), comm_, s));
}

void NcclComm::broadcast(void* buf, size_t count, DType dtype, int root, Stream& stream) {
  check_peer(root, "broadcast (root)");
  if (count == 0) return;
  cudaStream_t s = cuda_stream(stream);
  DeviceGuard guard(device_);
  MOEPEAK_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_datatype(dtype), root, comm_, s));
}

void NcclComm::barrier() {
  check_async_error();
  if (world_size() > 1) MOEPEAK_MPI_CHECK(MPI_Barrier(host_comm_));
}

void NcclComm::group_start() { MOEPEAK_NCCL_CHECK(ncclGroupStart()); }

void NcclComm::group_end() { MOEPEAK_NCCL_CHECK(ncclGroupEnd()); }

std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  MOEPEAK_CHECK(color >= 0, "Comm::split: color ", color, " must be >= 0");
  if (host_comm_ == MPI_COMM_NULL) return duplicate();  // a world of one without MPI
  MPI_Comm group = MPI_COMM_NULL;
  MOEPEAK_MPI_CHECK(MPI_Comm_split(host_comm_, color, key, &group));
  auto sub = std::make_unique<NcclComm>(split_rank_info(group, ranks_), group, device_);
  sub->set_name(name_ + "/split");
  MPI_Comm_free(&group);  // the new communicator keeps its own duplicate
  return sub;
}

std::unique_ptr<Comm> NcclComm::duplicate() {
  auto copy = std::make_unique<NcclComm>(ranks_, host_comm_, device_);
  copy->set_name(name_ + "/dup");
  return copy;
}

}  // namespace moepeak
