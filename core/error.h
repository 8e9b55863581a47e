// moepeak::Error and the check macros every layer uses.
//
// An Error carries the message, the source location that raised it, the identity of the process
// (host name and rank), and its kind, which decides what the user is shown (what()):
//
//   internal  a broken invariant of moepeak itself (MOEPEAK_CHECK, MOEPEAK_THROW): where in the
//             code it broke is what a bug report needs, so the host, rank and C++ file:line lead:
//                 [node07 rank 13/64] core/runtime/arena.cpp:88: out of device memory: ...
//   input     something the user gave is wrong: a config, a data file, a checkpoint, the command
//             line, the launch (MOEPEAK_INPUT_ERROR, MOEPEAK_CHECK_INPUT). The message names it
//             in the user's terms (file, line, key, tensor, offset); no C++ location is shown.
//             In a job of several ranks the host and rank still lead, since each rank reports
//             its own failure:
//                 ckpt/config.json: field "rope_theta" is missing
//                 [node07 rank 13/64] data/train.bin: token 70000 at offset 12 ... (W > 1)
//
// file() and line() are kept for both kinds; cli/main.cpp logs them at debug level.
// Library code throws; only cli/ catches and exits. This header stays free of fmt/spdlog so that
// CUDA sources (.cu, compiled as C++17 by nvcc) can include it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moepeak {

enum class ErrorKind { internal, input };

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line, ErrorKind kind = ErrorKind::internal);

  const std::string& message() const { return message_; }  // without the location prefix
  const char* file() const { return file_; }
  int line() const { return line_; }
  ErrorKind kind() const { return kind_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
  ErrorKind kind_;
};

// The text of `e` to embed in another Error raised over it: an input error's message alone (the
// outer one carries the prefix), an internal one's what() (its location is the point).
inline std::string nested_message(const Error& e) {
  return e.kind() == ErrorKind::input ? e.message() : std::string(e.what());
}

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
// The path of a source file from the repository's root, so messages say "core/runtime/arena.cpp":
// the build maps the absolute source folder away (-fmacro-prefix-map, CMakeLists.txt), and a
// compiler cache hands the compiler paths relative to the build folder ("../core/..."), whose
// leading "./" and "../" are dropped here.
const char* relative_source_path(const char* file);
}  // namespace detail

}  // namespace moepeak

// Throws moepeak::Error; the arguments are streamed together: MOEPEAK_THROW("bad size ", n).
#define MOEPEAK_THROW(...)                                       \
  throw ::moepeak::Error(::moepeak::detail::concat(__VA_ARGS__), \
                         ::moepeak::detail::relative_source_path(__FILE__), __LINE__)

// Throws an input Error (a config, data file, checkpoint, command line or launch the user gave is
// wrong): MOEPEAK_INPUT_ERROR(path, ":", line, ": unknown key '", key, "'"). Name what is wrong
// and where in the user's terms; the C++ location is not shown to the user.
#define MOEPEAK_INPUT_ERROR(...)                                                      \
  throw ::moepeak::Error(::moepeak::detail::concat(__VA_ARGS__),                      \
                         ::moepeak::detail::relative_source_path(__FILE__), __LINE__, \
                         ::moepeak::ErrorKind::input)

// An input check: throws MOEPEAK_INPUT_ERROR(...) unless `cond` (the message alone, no "check
// failed": the user did nothing wrong in the code).
#define MOEPEAK_CHECK_INPUT(cond, ...)  \
  do {                                  \
    if (!(cond)) {                      \
      MOEPEAK_INPUT_ERROR(__VA_ARGS__); \
    }                                   \
  } while (0)

// Host assert that stays on in release builds. The message says what was expected.
#define MOEPEAK_CHECK(cond, ...)                               \
  do {                                                         \
    if (!(cond)) {                                             \
      MOEPEAK_THROW("check failed: " #cond ": ", __VA_ARGS__); \
    }                                                          \
  } while (0)
