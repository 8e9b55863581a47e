// When a progress line redrawn in place ("\r", "ESC[K") may be drawn: the one rule that
// `moepeak train`'s progress line, `moepeak tune`'s bar and `moepeak data prepare`'s line share.
//
//   if (draws_progress(cfg.metrics.progress, STDOUT_FILENO)) ...   // the process's own output
//   draws_progress(mode, OutputTerminal{true, 120}, env)           // pure: tests feed the facts
//
// The rule (metrics.progress; docs/config.md, docs/design.md#conventions "The progress line"):
//   off      never.
//   always   always, wherever the output goes.
//   auto     only when the output is the user's terminal:
//              - it is a terminal (isatty), and
//              - under a launcher that hands each rank a pseudo-terminal of its own (OpenMPI's
//                mpirun/orted, PRRTE's prterun: OMPI_COMM_WORLD_SIZE or PMIX_RANK set), that
//                terminal has a window size (columns > 0).
// NOTES: OpenMPI gives every rank's stdout a pty whatever mpirun writes to, so isatty is true
// even in `mpirun ... > run.log` (open-mpi/ompi#7868). Since OpenMPI 4.0.6 / 4.1.2 (and PRRTE)
// the launcher copies its own stdout's window size onto that pty (TIOCGWINSZ at fork): a rank
// whose launcher writes to a terminal sees that terminal's columns, one whose launcher writes to
// a file or a pipe sees 0 x 0. That is the launcher's own output, read from inside the rank;
// an older OpenMPI always shows 0 x 0, so there the line is never drawn under mpirun (a log
// file gets log lines only; metrics.progress = "always" still draws it). srun gives a rank a
// terminal only under --pty, the user's own, sized like it (so PMIX_RANK from --mpi=pmix
// changes nothing there); a plain process and MPICH's Hydra (pipes) are decided by isatty.
#pragma once

#include <functional>

namespace moepeak {

// metrics.progress (core/config/config.h spells it "auto", "always", "off").
enum class ProgressMode { automatic, always, off };

// What the rule needs to know of one output stream.
struct OutputTerminal {
  bool is_terminal = false;  // isatty(fd)
  int columns = 0;           // the terminal's window width (TIOCGWINSZ); 0 when unknown or none
};

// The facts of file descriptor `fd` (STDOUT_FILENO, STDERR_FILENO).
OutputTerminal output_terminal(int fd);

// The value of an environment variable, or null when it is not set.
using EnvValue = std::function<const char*(const char* name)>;

// True when the environment says a launcher that gives each rank a pseudo-terminal of its own
// started this process (OpenMPI: OMPI_COMM_WORLD_SIZE; PRRTE / PMIx: PMIX_RANK).
bool launcher_gives_rank_a_terminal(const EnvValue& env);

// The rule above; pure.
bool draws_progress(ProgressMode mode, const OutputTerminal& output, const EnvValue& env);
// The rule for this process's `fd`: output_terminal(fd) and std::getenv.
bool draws_progress(ProgressMode mode, int fd);

}  // namespace moepeak
