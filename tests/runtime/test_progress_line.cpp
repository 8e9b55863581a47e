// The progress-line rule (core/progress_line.h) over fake outputs and environments: `off` and
// `always` whatever the output; `auto` on a plain terminal, never on a file or pipe, and under
// OpenMPI / PRRTE (whose ranks always get a pty) only when the launcher copied a window size onto
// it (its own stdout is a terminal). Also the real facts of a pipe and of a pseudo-terminal.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <map>
#include <string>

#include "core/progress_line.h"

namespace moepeak {
namespace {

// An environment of exactly `vars`.
EnvValue env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

const OutputTerminal kFile{false, 0};  // a redirect to a file or a pipe
const OutputTerminal kSizedTerminal{true, 120};
const OutputTerminal kUnsizedTerminal{true, 0};  // e.g. OpenMPI's pty when mpirun writes to a file

TEST(ProgressLine, OffNeverAndAlwaysAlways) {
  const EnvValue none = env_of({});
  const EnvValue openmpi = env_of({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  for (const OutputTerminal& out : {kFile, kSizedTerminal, kUnsizedTerminal}) {
    for (const EnvValue* env : {&none, &openmpi}) {
      EXPECT_FALSE(draws_progress(ProgressMode::off, out, *env));
      EXPECT_TRUE(draws_progress(ProgressMode::always, out, *env));
    }
  }
}

TEST(ProgressLine, AutoOnAPlainProcessFollowsTheTerminal) {
  const EnvValue none = env_of({});
  EXPECT_TRUE(draws_progress(ProgressMode::automatic, kSizedTerminal, none));
  EXPECT_TRUE(draws_progress(ProgressMode::automatic, kUnsizedTerminal, none));  // isatty decides
  EXPECT_FALSE(draws_progress(ProgressMode::automatic, kFile, none));
  // srun without --mpi=pmix: its --pty is the user's terminal, and no pty otherwise.
  const EnvValue srun = env_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "3"}});
  EXPECT_TRUE(draws_progress(ProgressMode::automatic, kUnsizedTerminal, srun));
  EXPECT_FALSE(draws_progress(ProgressMode::automatic, kFile, srun));
  // MPICH's Hydra hands ranks pipes: isatty decides.
  const EnvValue hydra = env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  EXPECT_TRUE(draws_progress(ProgressMode::automatic, kUnsizedTerminal, hydra));
  EXPECT_FALSE(draws_progress(ProgressMode::automatic, kFile, hydra));
}

TEST(ProgressLine, AutoUnderOpenMpiNeedsTheLaunchersWindow) {
  // `mpirun -np 2 moepeak train > run.log`: every rank's stdout is a pty of 0 x 0.
  for (const auto& vars : std::initializer_list<std::map<std::string, std::string>>{
           {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}},
           {{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}},  // -np 1 as well
           {{"PMIX_RANK", "0"}},                                            // prterun
       }) {
    const EnvValue env = env_of(vars);
    EXPECT_TRUE(launcher_gives_rank_a_terminal(env));
    EXPECT_FALSE(draws_progress(ProgressMode::automatic, kUnsizedTerminal, env));
    EXPECT_FALSE(draws_progress(ProgressMode::automatic, kFile, env));
    // mpirun on the user's terminal: the pty carries that terminal's window.
    EXPECT_TRUE(draws_progress(ProgressMode::automatic, kSizedTerminal, env));
  }
  EXPECT_FALSE(launcher_gives_rank_a_terminal(env_of({{"SLURM_PROCID", "0"}})));
  EXPECT_FALSE(launcher_gives_rank_a_terminal(env_of({{"PMI_RANK", "0"}})));
}

TEST(ProgressLine, OutputFactsOfAPipeAndOfASizedPty) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const OutputTerminal pipe_out = output_terminal(pipe_fds[1]);
  EXPECT_FALSE(pipe_out.is_terminal);
  EXPECT_EQ(pipe_out.columns, 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);

  int controller = -1, device = -1;
  winsize size{};
  size.ws_row = 40;
  size.ws_col = 97;
  ASSERT_EQ(openpty(&controller, &device, nullptr, nullptr, &size), 0);
  const OutputTerminal sized = output_terminal(device);
  EXPECT_TRUE(sized.is_terminal);
  EXPECT_EQ(sized.columns, 97);
  size.ws_row = size.ws_col = 0;  // what OpenMPI leaves when mpirun's stdout is no terminal
  ASSERT_EQ(ioctl(device, TIOCSWINSZ, &size), 0);
  const OutputTerminal unsized = output_terminal(device);
  EXPECT_TRUE(unsized.is_terminal);
  EXPECT_EQ(unsized.columns, 0);
  close(device);
  close(controller);
}

}  // namespace
}  // namespace moepeak
