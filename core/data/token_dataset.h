// Token datasets on disk, memory-mapped read-only: a dataset is one token stream.
//
// Formats (all little-endian):
//   llm.c / nanoGPT .bin, headerless   token_dtype = uint16 | uint32: the file is the tokens.
//   llm.c .bin with header             token_dtype = llmc: 256 int32 header, then the tokens;
//       header[0] magic, header[1] version, header[2] token count:
//       magic 20240520 version 1 = uint16 tokens (GPT-2), magic 20240801 version 7 = uint32
//       tokens (Llama 3), as llm.c's dev/data/data_common.py writes them.
//   Megatron-LM indexed dataset        <prefix>.idx + <prefix>.bin (megatron/core/datasets/
//       indexed_dataset.py). The .idx: "MMIDIDX\0\0" (9 bytes), version uint64 (= 1), dtype code
//       uint8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6/7 are floats and refused),
//       sequence count S uint64, document count D uint64, sequence lengths int32[S] (tokens),
//       sequence pointers int64[S] (byte offsets into the .bin), document index int64[D]
//       (sequence index where each document starts, then S). The documents' sequences are
//       concatenated in index order into one token stream; the .idx stays mapped so that
//       DocumentIndex can say where the documents start in it.
//
// The loader that windows a dataset's token stream is core/data/window_loader.h.
//
// Opening reads the header (and a Megatron .idx) only: nothing at open is O(dataset), so a
// 100B-token file starts as fast as a small one. Every token id is checked against the
// vocabulary when its window is read, before the step that uses it (read_cyclic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/data_loader.h"

namespace moepeak {

// A whole file mapped read-only (a zero-length file maps to nothing). Move-only.
class MappedFile {
 public:
  // Throws moepeak::Error naming the path when it cannot be opened, stat'ed or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void unmap();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// How token ids are stored in a file.
enum class TokenStorage { u8, i8, u16, i16, u32, i32, i64 };
size_t token_storage_size(TokenStorage storage);
std::string_view token_storage_name(TokenStorage storage);

// Where the documents of a Megatron dataset start in its token stream, read from its .idx (kept
// mapped) through two sparse tables built while open_megatron_dataset checks the sequences:
//   sequence_positions_[k]  the stream position of sequence first + k * kStride, for every such
//                           sequence index <= S
//   document_positions_[k]  the stream position of document-index entry k * kStride, for every
//                           such entry < the entry count E (= documents + 1; entry E - 1 is S)
// with first = the document index's entry 0 (the stream's first sequence). The stream position of
// sequence s is the sum of the lengths of sequences [first, s): it comes from the lengths, never
// from the pointers (a .bin need not hold its sequences in index order). A document starts at the
// stream position of its first sequence; position 0 (document 0) is a start; an empty document
// (no sequences, or only empty ones) starts where the next one does, and a trailing one at N,
// which is position 0 again.
// Memory: 8 bytes per kStride sequences plus 8 bytes per kStride documents (a dataset of 10^8
// one-sequence documents: 1.6 MB); nothing O(tokens). A query: O(log E) probes of O(kStride).
class DocumentIndex {
 public:
  static constexpr uint64_t kStride = 1024;

  DocumentIndex() = default;  // none (a .bin dataset): present() is false
  // `idx` as open_megatron_dataset has checked it: S sequences whose int32 lengths start at byte
  // lengths_at, E document-index entries (int64, non-decreasing, from first to S) at byte
  // entries_at. add_sequence() then fills the tables.
  DocumentIndex(MappedFile idx, uint64_t sequences, uint64_t entries, uint64_t lengths_at,
                uint64_t entries_at);
  // Called for s = first, first + 1, ..., S in this order, with the stream position of sequence
  // s (s = S: N, the stream's length); the lengths of sequences >= first must be >= 0.
  void add_sequence(uint64_t s, uint64_t stream_position);

  bool present() const { return idx_.has_value(); }
  uint64_t stream_tokens() const { return stream_tokens_; }  // N, once sequence S is added
  // Appends to `offsets`, ascending, each o in [1, count] with stream position (begin + o) mod N
  // a document start, once per position. count <= N (moepeak::Error otherwise, and unless every
  // sequence was added).
  void starts(uint64_t begin, uint64_t count, std::vector<int64_t>& offsets) const;

 private:
  uint64_t length(uint64_t s) const;          // of sequence s
  uint64_t entry_sequence(uint64_t e) const;  // document-index entry e
  uint64_t sequence_position(uint64_t s) const;
  // sequence_position(to) from that of `from` <= to.
  uint64_t position_after(uint64_t from, uint64_t from_position, uint64_t to) const;
  // The first entry whose document starts at or after stream position `at` (< N).
  uint64_t first_entry_at_or_after(uint64_t at) const;
  // Appends lo_offset + (p - lo) for each distinct document start p in stream positions
  // [lo, hi], hi < N, ascending.
  void append_starts(uint64_t lo, uint64_t hi, uint64_t lo_offset, std::vector<int64_t>& out) const;

  std::optional<MappedFile> idx_;
  uint64_t sequences_ = 0;  // S
  uint64_t entries_ = 0;    // E
  uint64_t lengths_at_ = 0;
  uint64_t entries_at_ = 0;
  uint64_t first_ = 0;  // entry 0: the stream's first sequence
  // The next entry (a multiple of kStride) add_sequence records, and its sequence.
  uint64_t next_recorded_ = 0;
  uint64_t next_recorded_sequence_ = 0;
  bool complete_ = false;  // sequence S added
  uint64_t stream_tokens_ = 0;
  std::vector<uint64_t> sequence_positions_;
  std::vector<uint64_t> document_positions_;
};

// A token stream made of runs of tokens in one mapped file, in order.
class TokenDataset {
 public:
  struct Run {
    uint64_t stream_begin;  // position in the stream of the run's first token
    uint64_t byte_offset;   // where the run starts in the file
    uint64_t tokens;        // run length
  };

  // `runs` (their stream_begin is ignored) must lie inside the file (checked) and are
  // concatenated in order; adjacent runs that continue each other in the file are merged.
  // data_begin is the byte where the file's token data starts: token offsets in error messages
  // count tokens from there. `documents`: a Megatron dataset's document index, over this stream.
  TokenDataset(MappedFile file, TokenStorage storage, LoaderKind kind, std::string format,
               uint64_t data_begin, const std::vector<Run>& runs,
               DocumentIndex documents = DocumentIndex());

  const std::string& path() const { return file_.path(); }
  LoaderKind kind() const { return kind_; }
  TokenStorage storage() const { return storage_; }
  const std::string& format() const { return format_; }  // for describe(), e.g. "llm.c .bin"
  uint64_t token_count() const { return token_count_; }  // N

  // Writes the tokens at stream positions begin, begin+1, ... (modulo N), `count` of them,
  // each checked as it is read: throws moepeak::Error on the first token id outside
  // [0, vocab_size): "PATH: token X at offset I (byte B) is >= model.vocab_size V" (or "is
  // negative"), where I counts tokens of the file's storage type from the start of the file's
  // token data and B is the byte position in the file. `out` is then partly written.
  void read_cyclic(uint64_t begin, uint64_t count, int64_t* out, int64_t vocab_size) const;

  // Whether the dataset lists its documents (a Megatron dataset).
  bool has_document_index() const { return documents_.present(); }
  // Appends to `offsets`, ascending, every o in [1, count] at which a document starts: stream
  // position (begin + o) mod N begins a document (see DocumentIndex; position 0 is a start, so a
  // range that wraps past the end sees one at N). Each position once; count <= N. Throws
  // moepeak::Error unless has_document_index() (callers check it, to name their setting).
  void document_starts(uint64_t begin, uint64_t count, std::vector<int64_t>& offsets) const;

 private:
  [[noreturn]] void bad_token(int64_t id, uint64_t byte, int64_t vocab_size) const;
  MappedFile file_;
  TokenStorage storage_;
  LoaderKind kind_;
  std::string format_;
  std::vector<Run> runs_;
  uint64_t token_count_ = 0;
  uint64_t data_begin_ = 0;
  DocumentIndex documents_;
};

// Opens an llm.c / nanoGPT token file: headerless uint16/uint32 or, for TokenDtype::llmc, with
// llm.c's 256 x int32 header. Throws moepeak::Error naming the file on a missing file, a
// truncated header, a bad magic or version, a token count that disagrees with the file size, or
// a size that is not a whole number of tokens.
TokenDataset open_token_bin(const std::string& path, TokenDtype token_dtype);

// Opens a Megatron indexed dataset from its prefix, or the path of its .bin or .idx. Throws
// moepeak::Error naming the file (and the entry) on anything malformed.
TokenDataset open_megatron_dataset(const std::string& path);

// open_token_bin (kind bin) or open_megatron_dataset (kind megatron).
TokenDataset open_token_dataset(DatasetKind kind, const std::string& path, TokenDtype token_dtype);

// Throws moepeak::Error naming both files and token types unless `other` stores its ids as
// `first` does; the roles say what each is to the run ("training.datasets[1]",
// "eval.dataset_path").
void check_same_token_type(const TokenDataset& first, const std::string& first_role,
                           const TokenDataset& other, const std::string& other_role);

}  // namespace moepeak
