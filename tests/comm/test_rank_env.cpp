// Rank discovery from fake launcher environments (slurm/rank_env.h): srun, mpirun (also inside an
// sbatch allocation), PMIx, MPICH's PMI, a plain process, and inconsistent values.
//
// The environments are the variables a sandbox Slurm 22.05 + OpenMPI 4.1 really set (trimmed):
// `srun -n 4 --mpi=pmix` task 1, the batch script of `sbatch -n 4` itself, and mpirun -np 4
// inside that batch script.
//
//     ctest -R test_rank_env --output-on-failure
#include <gtest/gtest.h>

#include "core/error.h"
#include "slurm/rank_env.h"

namespace moepeak {
namespace {

using Vars = std::map<std::string, std::string>;

LauncherEnv detect(const Vars& vars) { return detect_launcher_env(env_from_map(vars)); }

// Expects an Error whose message contains every one of `parts`.
void expect_error_naming(const Vars& vars, std::initializer_list<std::string> parts) {
  try {
    detect(vars);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(e.message().find(part), std::string::npos)
          << "message lacks '" << part << "': " << e.message();
    }
  }
}

const Vars kSrunTask1 = {{"SLURM_JOB_ID", "1"},
                         {"SLURM_JOBID", "1"},
                         {"SLURM_STEP_ID", "0"},
                         {"SLURM_STEPID", "0"},
                         {"SLURM_PROCID", "1"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_NODEID", "0"},
                         {"SLURM_NTASKS", "4"},
                         {"SLURM_NPROCS", "4"},
                         {"SLURM_STEP_NUM_TASKS", "4"},
                         {"SLURM_STEP_TASKS_PER_NODE", "4"},
                         {"SLURM_TASKS_PER_NODE", "4"},
                         {"PMIX_RANK", "1"},
                         {"SLURM_MPI_TYPE", "pmix"}};

const Vars kSbatchScript = {{"SLURM_JOB_ID", "1"},        {"SLURM_PROCID", "0"},
                            {"SLURM_LOCALID", "0"},       {"SLURM_NODEID", "0"},
                            {"SLURM_NTASKS", "4"},        {"SLURM_NPROCS", "4"},
                            {"SLURM_TASKS_PER_NODE", "4"}};

const Vars kMpirunInsideSbatch = {{"OMPI_COMM_WORLD_RANK", "2"},
                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_NODE_RANK", "2"},
                                  {"PMIX_RANK", "2"},
                                  {"SLURM_JOB_ID", "2"},
                                  {"SLURM_PROCID", "0"},
                                  {"SLURM_LOCALID", "0"},
                                  {"SLURM_NODEID", "0"},
                                  {"SLURM_NTASKS", "4"}};

TEST(RankEnv, PlainProcessIsNotLaunched) {
  LauncherEnv env = detect({{"HOME", "/root"}, {"PATH", "/usr/bin"}});
  EXPECT_EQ(env.launcher, Launcher::none);
  EXPECT_FALSE(env.launched());
  EXPECT_FALSE(env.rank.has_value());
  EXPECT_FALSE(env.world_size.has_value());
  EXPECT_EQ(env.describe(), "none");
}

TEST(RankEnv, SrunTask) {
  LauncherEnv env = detect(kSrunTask1);
  EXPECT_EQ(env.launcher, Launcher::slurm);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
  EXPECT_EQ(env.node_id, 0);
  EXPECT_EQ(env.job_id, "1");
  EXPECT_EQ(env.step_id, "0");
  EXPECT_EQ(env.rank_var, "SLURM_PROCID");
  EXPECT_EQ(env.world_size_var, "SLURM_STEP_NUM_TASKS");
  EXPECT_EQ(env.describe(), "slurm rank 1/4 local 1/4 node 0 job 1.0");
}

TEST(RankEnv, TheSbatchScriptItselfIsNotALaunchedRank) {
  // SLURM_PROCID=0 and SLURM_NTASKS=4 but no step id: a program run in the batch script (say
  // `moepeak plan`) is one process, not rank 0 of 4.
  LauncherEnv env = detect(kSbatchScript);
  EXPECT_EQ(env.launcher, Launcher::none);
  EXPECT_EQ(env.job_id, "1");
}

TEST(RankEnv, MpirunInsideAnAllocationWinsOverTheBatchStepsSlurmVariables) {
  LauncherEnv env = detect(kMpirunInsideSbatch);
  EXPECT_EQ(env.launcher, Launcher::openmpi);
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_size, 4);
  EXPECT_EQ(env.job_id, "2");
  EXPECT_EQ(env.local_rank_var, "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(RankEnv, SrunStepSmallerThanTheAllocationUsesTheStepsTaskCount) {
  Vars vars = kSrunTask1;
  vars["SLURM_NTASKS"] = "8";  // sbatch -n 8, then srun -n 4
  vars["SLURM_TASKS_PER_NODE"] = "8";
  LauncherEnv env = detect(vars);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_size, 4);
}

TEST(RankEnv, SrunMultiNodeTasksPerNodeList) {
  Vars vars = kSrunTask1;
  vars["SLURM_STEP_NUM_TASKS"] = "7";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x3),1";
  vars["SLURM_PROCID"] = "6";
  vars["SLURM_LOCALID"] = "0";
  vars["SLURM_NODEID"] = "3";
  LauncherEnv env = detect(vars);
  EXPECT_EQ(env.local_size, 1);
  EXPECT_EQ(env.node_id, 3);
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_PROCID"] = "5";
  vars["SLURM_LOCALID"] = "1";
  EXPECT_EQ(detect(vars).local_size, 2);
}

TEST(RankEnv, SrunWithoutTasksPerNodeFallsBackToNtasksPerNode) {
  Vars vars = kSrunTask1;
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  vars.erase("SLURM_TASKS_PER_NODE");
  vars["SLURM_NTASKS_PER_NODE"] = "2";
  vars["SLURM_LOCALID"] = "1";
  LauncherEnv env = detect(vars);
  EXPECT_EQ(env.local_size, 2);
  EXPECT_EQ(env.local_size_var, "SLURM_NTASKS_PER_NODE");
}

TEST(RankEnv, SlurmTasksPerNodeParsing) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0, "V"), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2, "V"), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3, "V"), 1);
  EXPECT_EQ(slurm_tasks_on_node("3,1(x2),5", 3, "V"), 5);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4, "V"), Error);
  EXPECT_THROW(slurm_tasks_on_node("2(x3", 0, "V"), Error);
  EXPECT_THROW(slurm_tasks_on_node("two", 0, "V"), Error);
  EXPECT_THROW(slurm_tasks_on_node("", 0, "V"), Error);
  EXPECT_THROW(slurm_tasks_on_node("2(x0)", 0, "V"), Error);
}

TEST(RankEnv, BarePmix) {
  LauncherEnv env = detect({{"PMIX_RANK", "3"}, {"PMIX_NAMESPACE", "prterun-x"}});
  EXPECT_EQ(env.launcher, Launcher::pmix);
  EXPECT_EQ(env.rank, 3);
  EXPECT_FALSE(env.world_size.has_value());  // PMIx does not put it in the environment
  EXPECT_TRUE(env.launched());
}

TEST(RankEnv, MpichHydraPmi) {
  LauncherEnv env = detect(
      {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "4"}});
  EXPECT_EQ(env.launcher, Launcher::pmi);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
}

TEST(RankEnv, RankAtOrAboveSizeIsAnErrorNamingBothVariables) {
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                      {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4"});
  Vars vars = kSrunTask1;
  vars["SLURM_PROCID"] = "9";
  expect_error_naming(vars, {"SLURM_PROCID=9", "SLURM_STEP_NUM_TASKS=4"});
  expect_error_naming({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}}, {"PMI_RANK=2", "PMI_SIZE=2"});
}

TEST(RankEnv, LocalRankAtOrAboveLocalSizeIsAnError) {
  Vars vars = kMpirunInsideSbatch;
  vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "4";
  expect_error_naming(vars, {"OMPI_COMM_WORLD_LOCAL_RANK=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4"});
  Vars srun = kSrunTask1;
  srun["SLURM_LOCALID"] = "4";
  expect_error_naming(srun, {"SLURM_LOCALID=4", "SLURM_STEP_TASKS_PER_NODE=4"});
}

TEST(RankEnv, LocalSizeAboveWorldSizeIsAnError) {
  Vars vars = kMpirunInsideSbatch;
  vars["OMPI_COMM_WORLD_LOCAL_SIZE"] = "8";
  expect_error_naming(vars, {"OMPI_COMM_WORLD_LOCAL_SIZE=8", "OMPI_COMM_WORLD_SIZE=4"});
}

TEST(RankEnv, NonNumbersAndZeroSizesAreErrors) {
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "one"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                      {"OMPI_COMM_WORLD_RANK", "'one'"});
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                      {"OMPI_COMM_WORLD_RANK", "'-1'"});
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4x"}},
                      {"OMPI_COMM_WORLD_SIZE", "'4x'"});
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}},
                      {"OMPI_COMM_WORLD_SIZE=0"});
  Vars vars = kSrunTask1;
  vars["SLURM_STEP_TASKS_PER_NODE"] = "4(x";
  expect_error_naming(vars, {"SLURM_STEP_TASKS_PER_NODE", "'4(x'"});
}

TEST(RankEnv, IncompleteLauncherEnvironmentsAreErrors) {
  expect_error_naming({{"OMPI_COMM_WORLD_SIZE", "4"}}, {"OMPI_COMM_WORLD_RANK"});
  expect_error_naming({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}}, {"SLURM_PROCID"});
}

TEST(RankEnv, ProcessEnvReadsTheRealEnvironment) {
  ::setenv("MOEPEAK_TEST_RANK_ENV_VAR", "17", 1);
  EnvLookup env = process_env();
  EXPECT_EQ(env("MOEPEAK_TEST_RANK_ENV_VAR"), "17");
  ::unsetenv("MOEPEAK_TEST_RANK_ENV_VAR");
  EXPECT_FALSE(env("MOEPEAK_TEST_RANK_ENV_VAR").has_value());
}

}  // namespace
}  // namespace moepeak
