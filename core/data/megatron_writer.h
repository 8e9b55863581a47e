// MegatronWriter: writes a Megatron-LM indexed dataset, <prefix>.bin + <prefix>.idx, in the
// layout open_megatron_dataset reads (core/data/token_dataset.h; megatron/core/datasets/
// indexed_dataset.py): one sequence per document, the document index 0, 1, ..., D.
//
//   MegatronWriter out("data/web", megatron_token_storage(vocab_size));
//   out.add_document(ids);   // streamed to data/web.bin's temporary file as it comes
//   ...
//   out.commit();            // data/web.idx, then data/web.bin, each replacing any old file
//
// Memory: the tokens go straight to the file; the index keeps 12 bytes per document (its length
// and offset) until commit(). Nothing is half-written: the .bin grows under a temporary name, the
// .idx is written atomically (core/atomic_file.h) at commit, then the .bin is renamed into place;
// a writer destroyed before commit() removes its temporary file and leaves old files as they were.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/data/token_dataset.h"

namespace moepeak {

// Megatron's choice (DType.optimal_dtype): uint16 below a vocabulary of 65,500, else int32.
TokenStorage megatron_token_storage(int64_t vocab_size);

class MegatronWriter {
 public:
  // storage: u16 or i32 (what Megatron writes). Throws moepeak::Error naming the path when the
  // temporary file cannot be created (a missing directory, no permission).
  MegatronWriter(std::string prefix, TokenStorage storage);
  ~MegatronWriter();
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;

  // Appends one document (at least one token; each id must fit the storage: moepeak::Error
  // otherwise, naming the id and the document).
  void add_document(std::span<const int32_t> ids);
  // Writes the .idx and moves the .bin into place; the writer is then done.
  void commit();

  const std::string& prefix() const { return prefix_; }
  uint64_t documents() const { return lengths_.size(); }
  uint64_t tokens() const { return tokens_; }
  uint64_t bin_bytes() const { return tokens_ * token_storage_size(storage_); }

 private:
  void write_bytes(const void* data, size_t bytes);
  std::string prefix_;
  std::string bin_temp_;
  TokenStorage storage_;
  int fd_ = -1;
  std::vector<int32_t> lengths_;
  uint64_t tokens_ = 0;
  std::vector<uint8_t> encoded_;  // one document in the storage type
  bool committed_ = false;
};

}  // namespace moepeak
