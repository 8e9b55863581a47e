// What the fuzz targets share: a per-process scratch directory where a target writes the bytes it
// was given as the file a parser reads (the parsers take paths, as moepeak's users give them),
// and the one exception a target lets through as "rejected": moepeak::Error of the input kind.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace moepeak::fuzz {

// Inputs larger than this are skipped: the parsers' limits are tested elsewhere, and big inputs
// only slow the search.
inline constexpr size_t kMaxInputBytes = 1 << 20;

// DIR: $TMPDIR/moepeak-fuzz-PID, made on first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      path =
          std::filesystem::temp_directory_path() / ("moepeak-fuzz-" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes `bytes` to scratch_dir()/name and returns its path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path.string();
}

// Runs `parse`; an input moepeak::Error is a rejected input (the parser's job), anything else
// escapes: an internal Error too, since a damaged file is the user's input and must be reported
// in the user's terms (core/error.h), not as a broken invariant with a C++ location.
// With MOEPEAK_FUZZ_VERBOSE set, says which (to check what a corpus's seeds exercise).
template <typename Parse>
void expect_accept_or_error(Parse&& parse) {
  const bool verbose = std::getenv("MOEPEAK_FUZZ_VERBOSE") != nullptr;
  try {
    parse();
    if (verbose) std::fprintf(stderr, "  accepted\n");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::input) {
      std::fprintf(stderr, "  an internal error on outside input: %s\n", e.what());
      throw;
    }
    if (verbose) std::fprintf(stderr, "  rejected: %s\n", e.what());
  }
}

}  // namespace moepeak::fuzz
