// Comm helpers: reduce_op_name and make_comm (which implementation serves a backend).
// Test: ctest -R 'test_comm_single|test_comm_mpi'
#include "core/comm/comm.h"

#include "core/comm/mpi_comm.h"
#include "core/comm/process_group.h"
#include "core/comm/single_comm.h"
#include "core/error.h"
#include "core/runtime/backend.h"
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

std::unique_ptr<Comm> make_comm(Backend& backend, const RankInfo& ranks) {
  if (ranks.world_size == 1) return std::make_unique<SingleComm>(backend.kind(), ranks);
  if (!process_group_uses_mpi()) {
    MOEPEAK_THROW("make_comm for ", ranks.world_size,
                  " ranks needs MPI: call "
                  "init_process_group() under mpirun or srun first");
  }
  switch (backend.kind()) {
    case BackendKind::cpu:
      return std::make_unique<MpiComm>(MPI_COMM_WORLD, ranks);
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

}  // namespace moepeak
