// The process group: who this process is in the job (rank, world size, host, local rank and
// size), found once at start-up from the launcher and MPI.
//
//     moepeak::ProcessGroup group;                  // or init_process_group() / finalize_...()
//     const moepeak::RankInfo& me = group.ranks();
//     auto comm = moepeak::make_comm(backend, me);  // declared in core/comm/comm.h
//
// When MPI is initialised:
//   - launched as a rank (mpirun, srun, a PMIx or PMI launcher; see slurm/rank_env.h):
//     MPI_Init_thread(MPI_THREAD_MULTIPLE), and an Error if the library grants less (the CPU
//     backend's communicators run MPI calls on several stream threads at once);
//   - started as a plain process (no launcher variables): MPI is NOT initialised and the process
//     is a world of one. OpenMPI 4's singleton MPI_Init forks an orted daemon
//     (~0.4 s here) and aborts the process where openmpi-bin is missing (e.g. a GPU node that got
//     only the shared libraries), while a world of one needs no MPI: make_comm returns the
//     single-rank communicator. Set MOEPEAK_MPI_SINGLETON=1 to initialise MPI anyway.
//   - MPI already initialised by the caller: used as it is (it must provide MPI_THREAD_MULTIPLE)
//     and left for the caller to finalise.
// MPI_COMM_WORLD gets MPI_ERRORS_RETURN, so MPI errors become moepeak::Error instead of aborting.
// Before MPI_Init, srun without a process-management interface (srun --mpi=none: OpenMPI would
// abort inside MPI_Init) is an Error that says to use `srun --mpi=pmix`.
// The world size and rank MPI reports are checked against the launcher's: ranks that each came
// up as their own MPI job of one (an MPI that could not reach the launcher's PMI) are an Error.
//
// The local rank comes from the launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, ...) and is
// cross-checked against MPI's shared-memory communicator (MPI_Comm_split_type): the launcher's
// values are used when, on every node, they are distinct and below the node's rank count;
// otherwise (or when the launcher gives none) the rank in the shared-memory communicator is used.
// local_rank_source() says which.
//
// init_process_group() is idempotent and thread-safe: later calls return the first result.
// finalize_process_group() finalises MPI if init initialised it; calling it twice is fine; init
// after finalize is an Error when MPI was used (MPI cannot be initialised twice).
#pragma once

#include <string>

#include "core/comm/comm.h"
#include "slurm/rank_env.h"

namespace moepeak {

RankInfo init_process_group();
void finalize_process_group();
// After an error on this rank of a job of W > 1 ranks: MPI_Abort, so the other ranks (which may
// be waiting in a collective this rank will never join) end too, with `exit_code`. Does nothing
// for a world of one or without MPI (the caller then just exits).
void abort_process_group(int exit_code) noexcept;

// True between init_process_group() and finalize_process_group().
bool process_group_initialized();
// True when MPI is initialised and usable (by init_process_group or by the caller).
bool process_group_uses_mpi();
// The launcher environment read at init (launcher none before init). The references stay valid;
// their contents change only at the next init.
const LauncherEnv& process_group_launcher_env();
// "launcher" (the launcher's variable, e.g. OMPI_COMM_WORLD_LOCAL_RANK), "shared-memory
// communicator" or "single process".
const std::string& local_rank_source();

// RAII holder: init in the constructor, finalize in the destructor (errors are swallowed there).
class ProcessGroup {
 public:
  ProcessGroup() : ranks_(init_process_group()) {}
  ~ProcessGroup() noexcept;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const RankInfo& ranks() const { return ranks_; }

 private:
  RankInfo ranks_;
};

}  // namespace moepeak
