// Rank discovery from the launcher's environment: which launcher started this process (srun,
// OpenMPI's mpirun, a bare PMIx or MPICH-style PMI launcher, or none) and what it says about the
// global rank, world size, local rank, local size, node and job.
//
// Pure functions over an environment lookup, so tests feed fake environments:
//
//     LauncherEnv env = detect_launcher_env(env_from_map({{"OMPI_COMM_WORLD_RANK", "1"}, ...}));
//     LauncherEnv env = detect_launcher_env(process_env());   // the real getenv
//
// Precedence (checked on a sandbox Slurm 22.05 with OpenMPI 4.1, see tests/comm/test_rank_env.cpp):
//   1. OpenMPI   OMPI_COMM_WORLD_SIZE is set. mpirun inside an sbatch allocation also leaves the
//                batch step's SLURM_PROCID=0 / SLURM_LOCALID=0 in every rank, so OpenMPI wins.
//   2. Slurm     srun sets SLURM_STEP_ID (and SLURM_STEPID) besides SLURM_PROCID / SLURM_LOCALID.
//                The batch script itself has SLURM_PROCID=0 and SLURM_NTASKS=n but no step id:
//                a program run directly in the batch script is not a launched rank.
//   3. PMIx      PMIX_RANK without the above (e.g. prterun); the world size is not in the env.
//   4. PMI       PMI_RANK / PMI_SIZE (MPICH's Hydra), MPI_LOCALRANKID for the local rank.
//   5. none      a plain process.
// Values that contradict each other (rank >= size, local rank >= local size, local size > size,
// a non-number) are moepeak::Error naming the variables.
//
// Test: ctest -R rank_env
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace moepeak {

enum class Launcher { none, openmpi, slurm, pmix, pmi };

std::string_view launcher_name(Launcher launcher);  // "none", "openmpi", "slurm", "pmix", "pmi"

// Returns the variable's value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

EnvLookup process_env();  // std::getenv
EnvLookup env_from_map(std::map<std::string, std::string> vars);

struct LauncherEnv {
  Launcher launcher = Launcher::none;
  // What the launcher said; empty where it says nothing (e.g. PMIx gives no world size).
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_size;
  std::optional<int> node_id;
  std::string job_id;   // SLURM_JOB_ID (also under mpirun inside an allocation); "" otherwise
  std::string step_id;  // SLURM_STEP_ID under srun
  // Which variables the fields came from, for error messages: e.g. "SLURM_PROCID".
  std::string rank_var, world_size_var, local_rank_var, local_size_var;

  // True when a launcher started this process as one rank of a job (even a job of one rank).
  bool launched() const { return launcher != Launcher::none; }
  // One line for logs: "slurm rank 3/8 local 1/4 node 1 job 1234.0".
  std::string describe() const;
};

// Throws moepeak::Error on values that are not numbers or contradict each other.
LauncherEnv detect_launcher_env(const EnvLookup& env);

// Slurm's compressed tasks-per-node list ("2(x3),1" = nodes 0..2 run 2 tasks, node 3 runs 1):
// the count on `node_id`. Throws moepeak::Error (naming `variable`) on a malformed list or a node
// outside it.
int slurm_tasks_on_node(std::string_view list, int node_id, std::string_view variable);

}  // namespace moepeak
