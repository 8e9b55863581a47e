// The data files of a sharded checkpoint (core/checkpoint/shard_manifest.h): a writer that
// streams one rank's slices through one bounded host buffer, checksumming each block as it goes
// (blocks of at most block_bytes, a new one at every slice),
// and a reader that maps the files and copies out any element range, verifying every block it
// touches.
//
//   ShardFileWriter w(dir + "/shard-00002.bin", 64 << 20 /* buffer */, manifest.block_bytes);
//   uint64_t at = w.append(shard.data(), shard.size() * 4);   // aligned to kShardAlignBytes
//   ShardFileInfo info = w.finish();                            // flushed, fsynced, closed
//
//   ShardReader r(dir, manifest);
//   r.read(manifest.tensor("model.norm.weight", dir), 32, 64, dst);   // elements [32, 64)
//
// Host memory: a writer holds its buffer (buffer_bytes, allocated once) and nothing else; the
// reader holds read-only maps of the files (page cache, not the process's own memory) and one bit
// per block it has verified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/checkpoint/checksum.h"
#include "core/checkpoint/shard_manifest.h"

namespace moepeak {

// Every slice starts at a multiple of this many bytes of its file (zero padding between).
inline constexpr uint64_t kShardAlignBytes = 64;

class ShardFileWriter {
 public:
  // Creates `path`, which must not exist (a save writes into a fresh directory). buffer_bytes >=
  // 4096; block_bytes > 0.
  ShardFileWriter(std::string path, size_t buffer_bytes, uint64_t block_bytes);
  // Unfinished (an error mid-save): closes and removes the file, so nothing half-written stays.
  ~ShardFileWriter();
  ShardFileWriter(const ShardFileWriter&) = delete;
  ShardFileWriter& operator=(const ShardFileWriter&) = delete;

  // Appends `bytes` at the next multiple of kShardAlignBytes; returns that offset.
  uint64_t append(const void* data, size_t bytes);
  // The same in pieces, without a copy: begin_slice() pads to the next multiple of
  // kShardAlignBytes and returns the offset; then, repeatedly, space() is the free part of the
  // buffer (never empty) and commit(n) adds its first n bytes to the file.
  uint64_t begin_slice();
  std::span<char> space();
  void commit(size_t bytes);
  // Writes what is buffered, fsyncs and closes; the file's size and block checksums, its name
  // without the directory.
  ShardFileInfo finish();

  uint64_t size() const { return size_; }
  size_t buffer_bytes() const { return buffer_.size(); }

 private:
  void put(const void* data, size_t bytes);
  void hash(const char* p, size_t bytes);
  void close_block();
  void flush();
  std::string path_;
  int fd_ = -1;
  uint64_t block_bytes_;
  std::vector<char> buffer_;
  size_t buffered_ = 0;
  uint64_t size_ = 0;
  uint64_t in_block_ = 0;  // bytes of the current block hashed so far
  Xxh3Stream block_hash_;
  std::vector<ShardBlock> blocks_;
  bool finished_ = false;
};

class ShardReader {
 public:
  // `dir` holds the manifest's files. Opens nothing yet: each file is opened, its length checked
  // and mapped on first use (a missing or short file is an error naming it and the tensor).
  ShardReader(std::string dir, const ShardManifest& manifest);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Copies elements [begin, end) of `tensor` (one of the manifest's) to `dest`, after verifying
  // the checksum of every block the bytes lie in; a mismatch is an error naming the file, the
  // block's bytes and the tensor.
  void read(const ShardTensor& tensor, int64_t begin, int64_t end, void* dest);

  // Blocks verified so far over all files (each is hashed once).
  uint64_t blocks_verified() const { return blocks_verified_; }

 private:
  struct Mapped;
  Mapped& mapped(int file, const ShardTensor& tensor);
  void verify(int file, Mapped& m, uint64_t offset, uint64_t bytes, const ShardTensor& tensor);
  std::string dir_;
  const ShardManifest& manifest_;
  std::vector<std::unique_ptr<Mapped>> files_;
  uint64_t blocks_verified_ = 0;
};

}  // namespace moepeak
