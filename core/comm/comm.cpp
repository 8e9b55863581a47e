// Comm helpers: reduce_op_name and make_comm (which implementation serves a backend).
// Test: ctest -R 'test_comm_single|test_comm_mpi'
#include "core/comm/comm.h"

#include <atomic>

#include "core/comm/mpi_comm.h"
#include "core/comm/process_group.h"
#include "core/comm/single_comm.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#ifdef MOEPEAK_WITH_CUDA
#include "core/comm/nccl_comm.h"
#endif

namespace moepeak {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::unique_ptr<Comm> make_comm(Backend& backend, const RankInfo& ranks, const LinkModel& link) {
  if (ranks.world_size == 1) return std::make_unique<SingleComm>(backend.kind(), ranks);
  if (!process_group_uses_mpi()) {
    MOEPEAK_THROW("make_comm for ", ranks.world_size,
                  " ranks needs MPI: call "
                  "init_process_group() under mpirun or srun first");
  }
  switch (backend.kind()) {
    case BackendKind::cpu: {
      auto comm = std::make_unique<MpiComm>(MPI_COMM_WORLD, ranks);
      comm->set_link_model(link);
      return comm;
    }
    case BackendKind::cuda:
#ifdef MOEPEAK_WITH_CUDA
      return std::make_unique<NcclComm>(ranks, MPI_COMM_WORLD);
#else
      break;
#endif
  }
  MOEPEAK_THROW("no communicator for backend ", backend_kind_name(backend.kind()),
                " in this build");
}

void all_reduce_host(Comm& comm, Backend& backend, Stream& stream, std::span<double> values,
                     ReduceOp op) {
  if (values.empty()) return;
  OwnedTensor buf = OwnedTensor::device(backend, Shape{static_cast<int64_t>(values.size())},
                                        DType::f64, LiveSet::workspace, "host all_reduce");
  const size_t bytes = values.size_bytes();
  backend.copy_async(buf.data(), values.data(), bytes, CopyKind::host_to_device, stream);
  comm.all_reduce(buf.data(), buf.data(), values.size(), DType::f64, op, stream);
  backend.copy_async(values.data(), buf.data(), bytes, CopyKind::device_to_host, stream);
  stream.synchronize();
}

std::vector<double> all_gather_host(Comm& comm, Backend& backend, Stream& stream,
                                    std::span<const double> mine) {
  const size_t n = mine.size(), W = static_cast<size_t>(comm.world_size());
  std::vector<double> all(n * W);
  if (n == 0) return all;
  OwnedTensor send = OwnedTensor::device(backend, Shape{static_cast<int64_t>(n)}, DType::f64,
                                         LiveSet::workspace, "host all_gather send");
  OwnedTensor recv = OwnedTensor::device(backend, Shape{static_cast<int64_t>(n * W)}, DType::f64,
                                         LiveSet::workspace, "host all_gather receive");
  backend.copy_async(send.data(), mine.data(), mine.size_bytes(), CopyKind::host_to_device, stream);
  comm.all_gather(send.data(), recv.data(), n, DType::f64, stream);
  backend.copy_async(all.data(), recv.data(), all.size() * sizeof(double), CopyKind::device_to_host,
                     stream);
  stream.synchronize();
  return all;
}

namespace {
std::atomic<int> g_group_communicators{0};
}  // namespace

Comm::Comm(RankInfo ranks) : ranks_(std::move(ranks)) {
  if (ranks_.world_size > 1) ++g_group_communicators;
}

Comm::~Comm() {
  if (ranks_.world_size > 1) --g_group_communicators;
}

int live_group_communicators() { return g_group_communicators.load(); }

void Comm::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= world_size()) {
    MOEPEAK_THROW(what, ": peer rank ", peer, " is outside the communicator's ranks [0, ",
                  world_size(), ")");
  }
}

void Comm::check_exchange_args(std::span<const PeerMessage> sends,
                               std::span<const PeerMessage> recvs) const {
  for (auto [list, what] :
       {std::pair{sends, "exchange (send)"}, std::pair{recvs, "exchange (recv)"}}) {
    for (const PeerMessage& m : list) {
      check_peer(m.peer, what);
      MOEPEAK_CHECK(m.peer != rank(), what, ": a message to or from this rank itself (", m.peer,
                    ") would wait forever; use sendrecv for a copy");
    }
  }
}

void Comm::check_all_to_all_v_args(std::span<const size_t> send_counts,
                                   std::span<const size_t> send_offsets,
                                   std::span<const size_t> recv_counts,
                                   std::span<const size_t> recv_offsets) const {
  const size_t world = static_cast<size_t>(world_size());
  MOEPEAK_CHECK(send_counts.size() == world && send_offsets.size() == world &&
                    recv_counts.size() == world && recv_offsets.size() == world,
                "all_to_all_v: counts and offsets need world_size (", world, ") entries; got send ",
                send_counts.size(), "/", send_offsets.size(), ", recv ", recv_counts.size(), "/",
                recv_offsets.size());
  const int me = rank();
  MOEPEAK_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v: rank ", me, " sends ",
                send_counts[me], " elements to itself but expects to receive ", recv_counts[me]);
}

}  // namespace moepeak
