// Atomic file writes: a reader of `path` sees either the old file or the complete new one, never
// a half-written file, even after a crash (docs/design.md#conventions: "nothing half-written").
//
//   write_file_atomically("ckpt/step_100/config.json", text);
//   write_file_atomically("ckpt/step_100/model.safetensors", [&](FileSink& out) {
//     out.write(header.data(), header.size());
//     out.write(weights, weight_bytes);
//   });
//
// The steps: create a temporary file next to the target (".NAME.tmp.PID.N" in the same directory,
// so the rename stays within one file system), write, fsync the file, rename it over the target,
// fsync the directory so the rename itself is durable. If anything fails, or the callback
// throws, the temporary file is removed, the target is left as it was, and moepeak::Error (or the
// callback's exception) propagates.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace moepeak {

// Where the callback of write_file_atomically writes: an open temporary file.
class FileSink {
 public:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // Writes all `bytes` (retrying short writes and EINTR); throws moepeak::Error naming the
  // target path on failure (e.g. ENOSPC).
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  size_t bytes_written() const { return written_; }
  const std::string& target_path() const { return path_; }

 private:
  int fd_;
  std::string path_;  // the target, for messages
  size_t written_ = 0;
};

// Writes the file through `produce` atomically, as described above. The new file's permissions
// are 0666 minus the umask, as for a plain open(O_CREAT).
void write_file_atomically(const std::string& path, const std::function<void(FileSink&)>& produce);
void write_file_atomically(const std::string& path, std::string_view contents);

// Creates `path` and any missing parents (like mkdir -p); an existing directory is fine. Throws
// moepeak::Error naming the path when a component exists and is not a directory, or on a
// permission or other file-system error.
void create_directories(const std::string& path);

}  // namespace moepeak
