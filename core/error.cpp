// moepeak::Error: the message behind the prefix its kind calls for (see error.h).
#include "core/error.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace moepeak {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_world{0};

// internal: "[host rank r/W] file:line: "; input: "[host rank r/W] " in a job of several
// ranks, nothing otherwise.
std::string format_prefix(const char* file, int line, ErrorKind kind) {
  const int r = g_rank.load(), world = g_world.load();
  if (kind == ErrorKind::input && (r < 0 || world <= 1)) return "";
  std::ostringstream os;
  os << "[" << process_host();
  if (r >= 0) {
    os << " rank " << r << "/" << world;
  }
  os << "] ";
  if (kind == ErrorKind::internal) os << file << ":" << line << ": ";
  return os.str();
}
}  // namespace

Error::Error(std::string message, const char* file, int line, ErrorKind kind)
    : std::runtime_error(format_prefix(file, line, kind) + message),
      message_(std::move(message)),
      file_(file),
      line_(line),
      kind_(kind) {}

void set_process_identity(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

int process_rank() { return g_rank.load(); }

std::string process_host() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

namespace detail {
const char* relative_source_path(const char* file) {
  for (;;) {
    if (std::strncmp(file, "../", 3) == 0) {
      file += 3;
    } else if (std::strncmp(file, "./", 2) == 0) {
      file += 2;
    } else {
      return file;
    }
  }
}
}  // namespace detail
}  // namespace moepeak
