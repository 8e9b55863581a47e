// init_process_group / finalize_process_group: rank discovery from the launcher and MPI (see
// process_group.h for when MPI is initialised and how the local rank is chosen).
// Test: ctest -R 'test_comm_mpi|test_comm_single'
#include "core/comm/process_group.h"

#include <mpi.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/comm/mpi_comm.h"
#include "core/error.h"

namespace moepeak {

namespace {

struct GroupState {
  std::mutex mu;
  bool initialized = false;
  bool finalized_mpi = false;  // we finalised MPI: it cannot come back
  bool mpi_initialized_by_us = false;
  bool uses_mpi = false;
  RankInfo ranks;
  LauncherEnv launcher;
  std::string local_rank_source = "single process";
};

GroupState& group_state() {
  static GroupState state;
  return state;
}

bool singleton_forced(const EnvLookup& env) {
  auto value = env("MOEPEAK_MPI_SINGLETON");
  return value && !value->empty() && *value != "0";
}

std::string local_rank_out_of_range(const std::string& var, int value, int node_size) {
  return var + "=" + std::to_string(value) + " is not below the " + std::to_string(node_size) +
         " ranks on this host";
}

// Chooses the local rank: the launcher's when it is consistent across the node, else the rank in
// the node's shared-memory communicator. Collective over `node_comm`, so every rank of a node
// makes the same choice.
void choose_local_rank(MPI_Comm node_comm, const LauncherEnv& launcher, RankInfo& ranks,
                       std::string& source) {
  int node_rank = 0, node_size = 1;
  MOEPEAK_MPI_CHECK(MPI_Comm_rank(node_comm, &node_rank));
  MOEPEAK_MPI_CHECK(MPI_Comm_size(node_comm, &node_size));
  // Each rank contributes (launcher local rank or -1, launcher local size or -1).
  int mine[2] = {launcher.local_rank.value_or(-1), launcher.local_size.value_or(-1)};
  std::vector<int> all(2 * static_cast<size_t>(node_size));
  MOEPEAK_MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, node_comm));

  std::string problem;
  std::vector<bool> seen(static_cast<size_t>(node_size), false);
  for (int i = 0; i < node_size && problem.empty(); ++i) {
    int local_rank = all[2 * i], local_size = all[2 * i + 1];
    if (local_rank < 0) {
      problem = "the launcher gives no local rank";
    } else if (local_rank >= node_size) {
      problem = local_rank_out_of_range(launcher.local_rank_var, local_rank, node_size);
    } else if (seen[static_cast<size_t>(local_rank)]) {
      problem = "two ranks on this host have " + launcher.local_rank_var + "=" +
                std::to_string(local_rank);
    } else if (local_size >= 0 && local_size != node_size) {
      problem = launcher.local_size_var + "=" + std::to_string(local_size) + " but " +
                std::to_string(node_size) + " ranks share this host";
    } else {
      seen[static_cast<size_t>(local_rank)] = true;
    }
  }
  ranks.local_size = node_size;
  if (problem.empty()) {
    ranks.local_rank = *launcher.local_rank;
    source = "launcher (" + launcher.local_rank_var + ")";
  } else {
    ranks.local_rank = node_rank;
    source = "shared-memory communicator (" + problem + ")";
  }
}

}  // namespace

RankInfo init_process_group() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.initialized) return state.ranks;
  if (state.finalized_mpi) {
    MOEPEAK_THROW(
        "init_process_group after finalize_process_group: MPI cannot be initialised a "
        "second time in one process");
  }
  EnvLookup env = process_env();
  LauncherEnv launcher = detect_launcher_env(env);

  int mpi_ready = 0, mpi_finalized = 0;
  MPI_Initialized(&mpi_ready);
  MPI_Finalized(&mpi_finalized);
  if (mpi_finalized) MOEPEAK_THROW("init_process_group: MPI has already been finalised");
  const bool use_mpi = mpi_ready || launcher.launched() || singleton_forced(env);

  // OpenMPI aborts the process inside MPI_Init when srun gave it no process-management interface;
  // say why first.
  if (!mpi_ready && launcher.launcher == Launcher::slurm && launcher.world_size.value_or(1) > 1 &&
      !env("PMIX_RANK") && !env("PMI_RANK") && !env("PMI_FD")) {
    MOEPEAK_INPUT_ERROR("started by srun as one of ", *launcher.world_size,
                        " tasks, but without a "
                        "process-management interface (no PMIX_RANK or PMI_RANK; SLURM_MPI_TYPE=",
                        env("SLURM_MPI_TYPE").value_or("unset"),
                        "), so MPI cannot connect the ranks: "
                        "launch with `srun --mpi=pmix` (see `srun --mpi=list`), or use mpirun");
  }

  RankInfo ranks;
  std::string local_source = "single process";
  if (!use_mpi) {
    ranks.host = process_host();
  } else {
    int provided = MPI_THREAD_SINGLE;
    if (!mpi_ready) {
      int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) {
        MOEPEAK_THROW("MPI_Init_thread failed (", launcher.describe(), "): ", mpi_error_string(rc));
      }
      state.mpi_initialized_by_us = true;
    } else {
      MOEPEAK_MPI_CHECK(MPI_Query_thread(&provided));
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      MOEPEAK_INPUT_ERROR("the MPI library provides thread level ", provided,
                          " but moepeak needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                          "): communication runs on several stream threads at once");
    }
    // Errors on the world communicator come back as codes (and become moepeak::Error).
    MOEPEAK_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MOEPEAK_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &ranks.rank));
    MOEPEAK_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ranks.world_size));
    if (launcher.world_size && *launcher.world_size != ranks.world_size) {
      MOEPEAK_INPUT_ERROR(
          launcher.world_size_var, "=", *launcher.world_size, " but MPI sees ", ranks.world_size,
          " rank(s)",
          ranks.world_size == 1
              ? ": each process started as its own MPI job. Under Slurm launch with "
                "`srun --mpi=pmix` (see `srun --mpi=list`), or use mpirun"
              : "");
    }
    if (launcher.rank && *launcher.rank != ranks.rank) {
      MOEPEAK_INPUT_ERROR(launcher.rank_var, "=", *launcher.rank, " but MPI says this is rank ",
                          ranks.rank, ": the launcher and MPI disagree about this process");
    }
    char name[MPI_MAX_PROCESSOR_NAME];
    int name_length = 0;
    MOEPEAK_MPI_CHECK(MPI_Get_processor_name(name, &name_length));
    ranks.host.assign(name, static_cast<size_t>(name_length));

    MPI_Comm node_comm = MPI_COMM_NULL;
    MOEPEAK_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ranks.rank,
                                          MPI_INFO_NULL, &node_comm));
    try {
      choose_local_rank(node_comm, launcher, ranks, local_source);
    } catch (...) {
      MPI_Comm_free(&node_comm);
      throw;
    }
    MOEPEAK_MPI_CHECK(MPI_Comm_free(&node_comm));
  }

  set_process_identity(ranks.rank, ranks.world_size);
  state.ranks = ranks;
  state.launcher = launcher;
  state.local_rank_source = local_source;
  state.uses_mpi = use_mpi;
  state.initialized = true;
  return ranks;
}

void finalize_process_group() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  state.initialized = false;
  state.uses_mpi = false;
  if (!state.mpi_initialized_by_us || state.finalized_mpi) return;
  state.finalized_mpi = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) MOEPEAK_THROW("MPI_Finalize failed: ", mpi_error_string(rc));
}

void abort_process_group(int exit_code) noexcept {
  GroupState& state = group_state();
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    abort = state.initialized && state.uses_mpi && state.ranks.world_size > 1;
  }
  int finalized = 1;
  if (abort) MPI_Finalized(&finalized);
  if (abort && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

bool process_group_initialized() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.initialized;
}

bool process_group_uses_mpi() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.initialized && state.uses_mpi;
}

const LauncherEnv& process_group_launcher_env() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.launcher;
}

const std::string& local_rank_source() {
  GroupState& state = group_state();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.local_rank_source;
}

ProcessGroup::~ProcessGroup() noexcept {
  try {
    finalize_process_group();
  } catch (...) {
    // A destructor cannot report; MPI_Finalize failing at exit leaves nothing to clean up.
  }
}

}  // namespace moepeak
