// The progress-line rule: see progress_line.h.
#include "core/progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>

namespace moepeak {

OutputTerminal output_terminal(int fd) {
  OutputTerminal out;
  out.is_terminal = isatty(fd) != 0;
  winsize size{};
  if (out.is_terminal && ioctl(fd, TIOCGWINSZ, &size) == 0) out.columns = size.ws_col;
  return out;
}

bool launcher_gives_rank_a_terminal(const EnvValue& env) {
  return env("OMPI_COMM_WORLD_SIZE") != nullptr || env("PMIX_RANK") != nullptr;
}

bool draws_progress(ProgressMode mode, const OutputTerminal& output, const EnvValue& env) {
  switch (mode) {
    case ProgressMode::off:
      return false;
    case ProgressMode::always:
      return true;
    case ProgressMode::automatic:
      break;
  }
  if (!output.is_terminal) return false;
  return !launcher_gives_rank_a_terminal(env) || output.columns > 0;
}

bool draws_progress(ProgressMode mode, int fd) {
  return draws_progress(mode, output_terminal(fd),
                        [](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace moepeak
