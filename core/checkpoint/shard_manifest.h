// The manifest of a sharded checkpoint (format "moepeak-sharded-checkpoint", version 1): which
// bytes of which file hold which elements of which tensor, and the checksums that prove them.
//
// A sharded checkpoint directory holds data files written in parallel, one per writing rank
// (core/checkpoint/shard_io.h), and manifest.json, written last: the commit point. A tensor of n
// elements (row-major, flattened) is stored as slices [begin, end) of those elements, each a
// contiguous run of (end - begin) * dtype_size bytes at `offset` in one file; a tensor's slices,
// in order, tile [0, n) exactly (n = 0: no slices). Which rank wrote which slice does not matter
// to a reader: any rank of any layout finds the byte ranges of the elements it needs with
// plan_read and reads only those.
//
// Integrity: every file is cut in consecutive blocks of at most `block_bytes`, a new block
// starting at every slice (so a block holds bytes of one slice and the padding after it), and
// the manifest keeps the length and XXH3-64 of each block (core/checkpoint/checksum.h): a reader
// verifies exactly the blocks it touches, and a failed block names the one tensor it belongs to.
// The file's length is checked against `bytes` before anything is read (a truncated file is an
// error naming it, not a short read).
//
// manifest.json:
//   {"format": "moepeak-sharded-checkpoint", "version": 1, "block_bytes": 8388608,
//    "metadata": {...},                                   free-form: step, cursors, layout
//    "files": [{"name": "shard-00000.bin", "bytes": 4096,
//               "blocks": [[4000, "0f3c..."], [96, "81aa..."]]}, ...],      [bytes, XXH3-64]
//    "tensors": [{"name": "model.norm.weight", "dtype": "F32", "shape": [64],
//                 "slices": [{"file": 0, "offset": 0, "begin": 0, "end": 32}, ...]}, ...],
//    "carried_files": [{"name": "mtp_layers.safetensors", "bytes": ..., "blocks": [...]}]}
// dtype is the safetensors spelling (F32, BF16, F64, I32, I64).
//
// "carried_files" (absent when there are none) lists files of the directory that hold no slices:
// tensors the run does not train and carries unchanged from checkpoint to checkpoint (DeepSeek-V3's
// MTP layers, core/checkpoint/mtp_layers.h), each a safetensors file of its own, with its size and
// the checksums of its blocks (at most block_bytes each) as "files" has them, so that a reader
// (the export) can prove them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the metadata object)

#include "core/runtime/dtype.h"

namespace moepeak {

inline constexpr std::string_view kShardManifestFormat = "moepeak-sharded-checkpoint";
inline constexpr int kShardManifestVersion = 1;
inline constexpr const char* kShardManifestName = "manifest.json";

// Elements [begin, end) of a tensor, stored at byte `offset` of files[file].
struct ShardSlice {
  int file = 0;
  uint64_t offset = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct ShardTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<ShardSlice> slices;  // ordered by begin, tiling [0, numel())
  int64_t numel() const;
};

struct ShardBlock {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  bool operator==(const ShardBlock&) const = default;
};

struct ShardFileInfo {
  std::string name;  // a plain file name inside the checkpoint directory
  uint64_t bytes = 0;
  std::vector<ShardBlock> blocks;  // consecutive from byte 0; their lengths add up to `bytes`
  bool operator==(const ShardFileInfo&) const = default;
};

// A file's entry of "files" and back (also each rank's sidecar during a save); errors name
// `where`.
nlohmann::json shard_file_to_json(const ShardFileInfo& file);
ShardFileInfo shard_file_from_json(const nlohmann::json& j, const std::string& where);

// One contiguous read of plan_read: `bytes` at `offset` of files[file] are elements
// [dest_element, dest_element + bytes / dtype_size) of the range asked for (0 = its first).
struct ShardReadPiece {
  int file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int64_t dest_element = 0;
};

struct ShardManifest {
  uint64_t block_bytes = 8ull << 20;
  nlohmann::json metadata = nlohmann::json::object();
  std::vector<ShardFileInfo> files;
  std::vector<ShardTensor> tensors;
  std::vector<ShardFileInfo> carried;  // "carried_files"

  // The tensor called `name`; throws moepeak::Error naming it and `where` when there is none.
  const ShardTensor& tensor(std::string_view name, std::string_view where) const;
  bool has_tensor(std::string_view name) const;

  std::string to_json() const;
  // Parses and validates (validate()); errors name `path` and the field, file or tensor at fault.
  static ShardManifest parse(std::string_view text, const std::string& path);
  // Every rule above: known format and version, block_bytes > 0, unique plain file names (over
  // files and carried_files), blocks of 1..block_bytes bytes covering each file, unique tensor
  // names, slices ordered and tiling each tensor exactly, element-aligned offsets, every slice
  // inside its file. Throws moepeak::Error naming `path`.
  void validate(const std::string& path) const;
};

// The pieces of files that hold elements [begin, end) of `tensor`, in element order (a range
// spanning several slices gives one piece per slice it meets). Throws when the range is outside
// the tensor.
std::vector<ShardReadPiece> plan_read(const ShardTensor& tensor, int64_t begin, int64_t end);

}  // namespace moepeak
