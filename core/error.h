// moepeak::Error and the check macros every layer uses.
//
// An Error carries the message, the source location that raised it, and the identity of the
// process (host name and rank) so that a failure on rank 13 of 64 says where it happened:
//
//     [node07 rank 13] core/runtime/arena.cpp:88: out of device memory: ...
//
// Library code throws; only cli/ catches and exits. This header stays free of fmt/spdlog so that
// CUDA sources (.cu, compiled as C++17 by nvcc) can include it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moepeak {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);

  const std::string& message() const { return message_; }  // without the location prefix
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// The process identity printed in every Error. Set once by comm initialisation; before that the
// rank prints as "-" and the host is read from gethostname().
void set_process_identity(int rank, int world_size);
int process_rank();  // -1 before set_process_identity
std::string process_host();

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// Strips the build's absolute source prefix so messages say "core/runtime/arena.cpp".
const char* relative_source_path(const char* file);
}  // namespace detail

}  // namespace moepeak

// Throws moepeak::Error; the arguments are streamed together: MOEPEAK_THROW("bad size ", n).
#define MOEPEAK_THROW(...)                                       \
  throw ::moepeak::Error(::moepeak::detail::concat(__VA_ARGS__), \
                         ::moepeak::detail::relative_source_path(__FILE__), __LINE__)

// Host assert that stays on in release builds. The message says what was expected.
#define MOEPEAK_CHECK(cond, ...)                               \
  do {                                                         \
    if (!(cond)) {                                             \
      MOEPEAK_THROW("check failed: " #cond ": ", __VA_ARGS__); \
    }                                                          \
  } while (0)
