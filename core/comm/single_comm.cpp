// SingleComm: a world of one rank; every operation is a stream-ordered copy (see single_comm.h).
// Test: ctest -R test_comm_single
#include "core/comm/single_comm.h"

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/runtime/cpu_stream.h"
#ifdef MOEPEAK_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/runtime/cuda_check.h"
#endif

namespace moepeak {

namespace {

void check_rank_zero(int peer, const char* what) {
  if (peer != 0) {
    MOEPEAK_THROW(what, ": rank ", peer, " does not exist in a world of one rank (only rank 0)");
  }
}

const char* at(const void* base, size_t elements, size_t element_size) {
  return static_cast<const char*>(base) + elements * element_size;
}

}  // namespace

SingleComm::SingleComm(BackendKind kind, RankInfo ranks)
    : Comm(std::move(ranks)), backend_kind_(kind) {
  MOEPEAK_CHECK(ranks_.world_size == 1 && ranks_.rank == 0,
                "SingleComm is for a world of one "
                "rank; got rank ",
                ranks_.rank, " of ", ranks_.world_size);
#ifndef MOEPEAK_WITH_CUDA
  MOEPEAK_CHECK(kind == BackendKind::cpu,
                "SingleComm for the CUDA backend in a build without CUDA");
#endif
}

void SingleComm::copy(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0 || dst == src) return;
  auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  MOEPEAK_CHECK(d + bytes <= s || s + bytes <= d,
                "source and destination overlap without being the same buffer");
  if (backend_kind_ == BackendKind::cpu) {
    as_cpu_stream(stream).enqueue([=] { std::memcpy(dst, src, bytes); });
    return;
  }
#ifdef MOEPEAK_WITH_CUDA
  // CUDA streams are created non-blocking and never null; a null handle is a CPU stream.
  MOEPEAK_CHECK(stream.native_handle() != nullptr, "stream '", stream.name(),
                "' is not a CUDA stream but this communicator is for the CUDA backend");
  MOEPEAK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream.native_handle())));
#endif
}

void SingleComm::all_to_all_v(const void* send, std::span<const size_t> send_counts,
                              std::span<const size_t> send_offsets, void* recv,
                              std::span<const size_t> recv_counts,
                              std::span<const size_t> recv_offsets, DType dtype, Stream& stream) {
  check_all_to_all_v_args(send_counts, send_offsets, recv_counts, recv_offsets);
  const size_t es = dtype_size(dtype);
  copy(static_cast<char*>(recv) + recv_offsets[0] * es, at(send, send_offsets[0], es),
       send_counts[0] * es, stream);
}

void SingleComm::exchange(std::span<const PeerMessage> sends, std::span<const PeerMessage> recvs,
                          DType /*dtype*/, Stream& /*stream*/) {
  check_exchange_args(sends, recvs);  // every message names this rank: an Error, none is sent
}

void SingleComm::send(const void*, size_t, DType, int peer, Stream&) {
  check_rank_zero(peer, "send");
  MOEPEAK_THROW("send to this rank itself would block forever; use sendrecv for a copy to self");
}

void SingleComm::recv(void*, size_t, DType, int peer, Stream&) {
  check_rank_zero(peer, "recv");
  MOEPEAK_THROW("recv from this rank itself would block forever; use sendrecv for a copy to self");
}

void SingleComm::sendrecv(const void* send, size_t send_count, int dst, void* recv,
                          size_t recv_count, int src, DType dtype, Stream& stream) {
  check_rank_zero(dst, "sendrecv (destination)");
  check_rank_zero(src, "sendrecv (source)");
  MOEPEAK_CHECK(send_count == recv_count, "sendrecv to itself with send count ", send_count,
                " but recv count ", recv_count);
  copy(recv, send, send_count * dtype_size(dtype), stream);
}

void SingleComm::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp,
                            Stream& stream) {
  copy(recv, send, count * dtype_size(dtype), stream);
}

void SingleComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                ReduceOp, Stream& stream) {
  copy(recv, send, recv_count * dtype_size(dtype), stream);
}

void SingleComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                            Stream& stream) {
  copy(recv, send, send_count * dtype_size(dtype), stream);
}

void SingleComm::broadcast(void*, size_t, DType, int root, Stream&) {
  check_rank_zero(root, "broadcast (root)");
}

std::unique_ptr<Comm> SingleComm::split(int color, int /*key*/) {
  MOEPEAK_CHECK(color >= 0, "Comm::split: color ", color, " must be >= 0");
  return duplicate();  // the one rank is the whole group
}

std::unique_ptr<Comm> SingleComm::duplicate() {
  auto copy = std::make_unique<SingleComm>(backend_kind_, ranks_);
  copy->set_name(name_ + "/dup");
  return copy;
}

}  // namespace moepeak
