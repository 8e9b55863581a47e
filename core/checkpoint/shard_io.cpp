// Sharded checkpoint files: the buffered, checksumming writer and the mapping, verifying reader.
#include "core/checkpoint/shard_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fault_injection.h"

namespace moepeak {

namespace {

std::string base_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

// ---- ShardFileWriter -------------------------------------------------------------------------

ShardFileWriter::ShardFileWriter(std::string path, size_t buffer_bytes, uint64_t block_bytes)
    : path_(std::move(path)), block_bytes_(block_bytes) {
  MOEPEAK_CHECK(buffer_bytes >= 4096, "a shard write buffer needs >= 4096 bytes, not ",
                buffer_bytes);
  MOEPEAK_CHECK(block_bytes > 0, "shard checksum blocks need > 0 bytes");
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) MOEPEAK_INPUT_ERROR("cannot create ", path_, ": ", std::strerror(errno));
  buffer_.resize(buffer_bytes);
}

ShardFileWriter::~ShardFileWriter() {
  if (finished_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(path_.c_str());
}

uint64_t ShardFileWriter::append(const void* data, size_t bytes) {
  const uint64_t at = begin_slice();
  put(data, bytes);
  return at;
}

uint64_t ShardFileWriter::begin_slice() {
  MOEPEAK_CHECK(!finished_, "write to ", path_, " after finish()");
  static constexpr char kZeros[kShardAlignBytes] = {};
  const uint64_t pad = (kShardAlignBytes - size_ % kShardAlignBytes) % kShardAlignBytes;
  put(kZeros, pad);
  close_block();  // a slice starts a block: a failed block names one tensor
  return size_;
}

std::span<char> ShardFileWriter::space() {
  MOEPEAK_CHECK(!finished_, "write to ", path_, " after finish()");
  if (buffered_ == buffer_.size()) flush();
  return {buffer_.data() + buffered_, buffer_.size() - buffered_};
}

void ShardFileWriter::commit(size_t bytes) {
  MOEPEAK_CHECK(bytes <= buffer_.size() - buffered_, "commit of ", bytes, " bytes to ", path_,
                " past its buffer's free ", buffer_.size() - buffered_);
  hash(buffer_.data() + buffered_, bytes);
  buffered_ += bytes;
  size_ += bytes;
  if (buffered_ == buffer_.size()) flush();
}

void ShardFileWriter::put(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, n);
    commit(n);
    p += n;
    bytes -= n;
  }
}

// NOTES: bytes are hashed as they enter the file's byte stream (put, commit), so the blocks
// follow file offsets whatever the buffer's size: a block may span several flushes and a flush
// several blocks.
void ShardFileWriter::hash(const char* p, size_t bytes) {
  while (bytes > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, block_bytes_ - in_block_));
    block_hash_.update(p, n);
    in_block_ += n;
    p += n;
    bytes -= n;
    if (in_block_ == block_bytes_) close_block();
  }
}

void ShardFileWriter::close_block() {
  if (in_block_ == 0) return;
  blocks_.push_back({in_block_, block_hash_.digest()});
  block_hash_.reset();
  in_block_ = 0;
}

void ShardFileWriter::flush() {
  size_t done = 0;
  while (done < buffered_) {
    ssize_t w = -1;
    if (fault_here("save_write")) {
      errno = ENOSPC;  // tests/faults: the disk full in the middle of a shard
    } else {
      w = ::write(fd_, buffer_.data() + done, buffered_ - done);
    }
    if (w < 0) {
      if (errno == EINTR) continue;
      MOEPEAK_INPUT_ERROR("writing ", path_, ": ", std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
  buffered_ = 0;
}

ShardFileInfo ShardFileWriter::finish() {
  MOEPEAK_CHECK(!finished_, "finish() of ", path_, " twice");
  flush();
  close_block();
  if (::fsync(fd_) != 0) MOEPEAK_INPUT_ERROR("fsync of ", path_, ": ", std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    MOEPEAK_INPUT_ERROR("closing ", path_, ": ", std::strerror(errno));
  }
  fd_ = -1;
  finished_ = true;
  return ShardFileInfo{base_name(path_), size_, std::move(blocks_)};
}

// ---- ShardReader -----------------------------------------------------------------------------

struct ShardReader::Mapped {
  const char* data = nullptr;
  uint64_t bytes = 0;
  std::vector<uint64_t> starts;  // per block: its first byte
  std::vector<bool> verified;    // per block
};

ShardReader::ShardReader(std::string dir, const ShardManifest& manifest)
    : dir_(std::move(dir)), manifest_(manifest) {
  files_.resize(manifest_.files.size());
}

ShardReader::~ShardReader() {
  for (const std::unique_ptr<Mapped>& m : files_) {
    if (m && m->data != nullptr) ::munmap(const_cast<char*>(m->data), m->bytes);
  }
}

ShardReader::Mapped& ShardReader::mapped(int file, const ShardTensor& tensor) {
  std::unique_ptr<Mapped>& slot = files_[static_cast<size_t>(file)];
  if (slot) return *slot;
  const ShardFileInfo& info = manifest_.files[static_cast<size_t>(file)];
  const std::string path = (std::filesystem::path(dir_) / info.name).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    MOEPEAK_INPUT_ERROR(path, ": cannot open (", std::strerror(errno),
                        "); the manifest lists it for tensor '", tensor.name, "'");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    MOEPEAK_INPUT_ERROR(path, ": cannot stat (", std::strerror(e), ")");
  }
  if (static_cast<uint64_t>(st.st_size) != info.bytes) {
    ::close(fd);
    MOEPEAK_INPUT_ERROR(path, " is ", st.st_size, " bytes; the manifest says ", info.bytes,
                        (static_cast<uint64_t>(st.st_size) < info.bytes ? " (truncated)" : ""),
                        "; tensor '", tensor.name, "' reads from it");
  }
  auto m = std::make_unique<Mapped>();
  m->bytes = info.bytes;
  m->verified.assign(info.blocks.size(), false);
  uint64_t start = 0;
  for (const ShardBlock& b : info.blocks) {
    m->starts.push_back(start);
    start += b.bytes;
  }
  if (info.bytes > 0) {
    void* p = ::mmap(nullptr, info.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      MOEPEAK_INPUT_ERROR(path, ": cannot map (", std::strerror(e), ")");
    }
    m->data = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping keeps the file
  slot = std::move(m);
  return *slot;
}

void ShardReader::verify(int file, Mapped& m, uint64_t offset, uint64_t bytes,
                         const ShardTensor& tensor) {
  if (bytes == 0) return;
  const ShardFileInfo& info = manifest_.files[static_cast<size_t>(file)];
  // The block holding `offset`: the last one starting at or before it.
  size_t b = static_cast<size_t>(std::upper_bound(m.starts.begin(), m.starts.end(), offset) -
                                 m.starts.begin()) -
             1;
  for (; b < info.blocks.size() && m.starts[b] < offset + bytes; ++b) {
    if (m.verified[b]) continue;
    const uint64_t lo = m.starts[b], hi = lo + info.blocks[b].bytes;
    const uint64_t got = xxh3_64(m.data + lo, hi - lo);
    if (got != info.blocks[b].xxh3) {
      MOEPEAK_INPUT_ERROR((std::filesystem::path(dir_) / info.name).string(), ": bytes [", lo, ", ",
                          hi, ") (block ", b, ") fail their checksum (XXH3 ", checksum_hex(got),
                          ", the manifest says ", checksum_hex(info.blocks[b].xxh3),
                          "); they hold tensor '", tensor.name, "': the checkpoint is corrupt");
    }
    m.verified[b] = true;
    ++blocks_verified_;
  }
}

void ShardReader::read(const ShardTensor& tensor, int64_t begin, int64_t end, void* dest) {
  const size_t es = dtype_size(tensor.dtype);
  for (const ShardReadPiece& piece : plan_read(tensor, begin, end)) {
    Mapped& m = mapped(piece.file, tensor);
    verify(piece.file, m, piece.offset, piece.bytes, tensor);
    std::memcpy(static_cast<char*>(dest) + static_cast<size_t>(piece.dest_element) * es,
                m.data + piece.offset, piece.bytes);
  }
}

}  // namespace moepeak
