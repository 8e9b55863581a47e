// Atomic file writes (temp file, fsync, rename, fsync of the directory) and mkdir -p.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace moepeak {

namespace {

// Closes a descriptor and removes the temporary file unless committed.
class TemporaryFile {
 public:
  TemporaryFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the descriptor, reporting a close error (NFS reports write errors there).
  void close_checked(const std::string& target) {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      MOEPEAK_INPUT_ERROR(target, ": cannot close the temporary file ", path_, ": ",
                          std::strerror(errno));
  }
  void mark_committed() { committed_ = true; }

 private:
  int fd_;
  std::string path_;
  bool committed_ = false;
};

std::atomic<uint64_t> temporary_counter{0};

// Splits "dir/name" into ("dir", "name"); "name" alone is in ".".
std::pair<std::string, std::string> split_directory(const std::string& path) {
  std::filesystem::path p(path);
  std::string directory = p.parent_path().string();
  if (directory.empty()) directory = ".";
  return {directory, p.filename().string()};
}

TemporaryFile create_temporary(const std::string& target, const std::string& directory,
                               const std::string& name) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = detail::concat(directory, "/.", name, ".tmp.", ::getpid(), ".",
                                      temporary_counter.fetch_add(1));
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return TemporaryFile(fd, temp);
    if (errno != EEXIST) {
      MOEPEAK_INPUT_ERROR(target, ": cannot create a temporary file in ", directory, ": ",
                          std::strerror(errno));
    }
  }
  MOEPEAK_INPUT_ERROR(target, ": cannot find a free temporary file name in ", directory);
}

void fsync_directory(const std::string& target, const std::string& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    MOEPEAK_INPUT_ERROR(target, ": cannot open directory ", directory,
                        " to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot sync directories (EINVAL); the rename is done, so that is not fatal.
  if (rc != 0 && err != EINVAL)
    MOEPEAK_INPUT_ERROR(target, ": cannot sync directory ", directory, ": ", std::strerror(err));
}

}  // namespace

void FileSink::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      MOEPEAK_INPUT_ERROR(path_, ": write failed after ", written_,
                          " bytes: ", std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void write_file_atomically(const std::string& path, const std::function<void(FileSink&)>& produce) {
  auto [directory, name] = split_directory(path);
  if (name.empty() || name == "." || name == "..") MOEPEAK_INPUT_ERROR(path, ": not a file path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    MOEPEAK_INPUT_ERROR(path, ": is a directory, cannot write a file there");
  }
  TemporaryFile temp = create_temporary(path, directory, name);
  FileSink sink(temp.fd(), path);
  produce(sink);
  if (::fsync(temp.fd()) != 0)
    MOEPEAK_INPUT_ERROR(path, ": cannot sync ", temp.path(), ": ", std::strerror(errno));
  temp.close_checked(path);
  if (::rename(temp.path().c_str(), path.c_str()) != 0) {
    MOEPEAK_INPUT_ERROR(path, ": cannot rename ", temp.path(), " over it: ", std::strerror(errno));
  }
  temp.mark_committed();
  fsync_directory(path, directory);
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  write_file_atomically(path, [&](FileSink& out) { out.write(contents); });
}

void create_directories(const std::string& path) {
  if (path.empty()) MOEPEAK_INPUT_ERROR("cannot create a directory with an empty path");
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) MOEPEAK_INPUT_ERROR(path, ": cannot create directory: ", ec.message());
  if (!std::filesystem::is_directory(path, ec))
    MOEPEAK_INPUT_ERROR(path, ": exists and is not a directory");
}

}  // namespace moepeak
