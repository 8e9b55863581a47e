// Token files on disk: the read-only mapping, the llm.c / nanoGPT .bin and Megatron .bin/.idx
// readers, the checked reads, and a Megatron dataset's document index. Formats:
// core/data/token_dataset.h.
#include "core/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and are read in place");

namespace moepeak {

// ---- MappedFile -------------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MOEPEAK_INPUT_ERROR(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    MOEPEAK_INPUT_ERROR(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MOEPEAK_INPUT_ERROR(path, ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      MOEPEAK_INPUT_ERROR(path, ": cannot map ", size_, " bytes: ", std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- Token storage types ------------------------------------------------------------------------

size_t token_storage_size(TokenStorage storage) {
  switch (storage) {
    case TokenStorage::u8:
    case TokenStorage::i8:
      return 1;
    case TokenStorage::u16:
    case TokenStorage::i16:
      return 2;
    case TokenStorage::u32:
    case TokenStorage::i32:
      return 4;
    case TokenStorage::i64:
      return 8;
  }
  return 0;
}

std::string_view token_storage_name(TokenStorage storage) {
  switch (storage) {
    case TokenStorage::u8:
      return "uint8";
    case TokenStorage::i8:
      return "int8";
    case TokenStorage::u16:
      return "uint16";
    case TokenStorage::i16:
      return "int16";
    case TokenStorage::u32:
      return "uint32";
    case TokenStorage::i32:
      return "int32";
    case TokenStorage::i64:
      return "int64";
  }
  return "?";
}

namespace {

// Calls fn(T{}) with T the C++ type stored as `storage`.
template <typename Fn>
decltype(auto) with_storage_type(TokenStorage storage, Fn&& fn) {
  switch (storage) {
    case TokenStorage::u8:
      return fn(uint8_t{});
    case TokenStorage::i8:
      return fn(int8_t{});
    case TokenStorage::u16:
      return fn(uint16_t{});
    case TokenStorage::i16:
      return fn(int16_t{});
    case TokenStorage::u32:
      return fn(uint32_t{});
    case TokenStorage::i32:
      return fn(int32_t{});
    case TokenStorage::i64:
      return fn(int64_t{});
  }
  return fn(uint8_t{});
}

template <typename T>
T load_le(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

// ---- DocumentIndex ------------------------------------------------------------------------------

DocumentIndex::DocumentIndex(MappedFile idx, uint64_t sequences, uint64_t entries,
                             uint64_t lengths_at, uint64_t entries_at)
    : idx_(std::move(idx)),
      sequences_(sequences),
      entries_(entries),
      lengths_at_(lengths_at),
      entries_at_(entries_at) {
  MOEPEAK_CHECK(entries_ >= 1 && lengths_at_ + 4 * sequences_ <= idx_->size() &&
                    entries_at_ + 8 * entries_ <= idx_->size(),
                idx_->path(), ": a document index of ", entries_, " entries over ", sequences_,
                " sequences does not fit its ", idx_->size(), " bytes");
  first_ = entry_sequence(0);
  next_recorded_sequence_ = first_;
  sequence_positions_.reserve(static_cast<size_t>((sequences_ - first_) / kStride + 1));
  document_positions_.reserve(static_cast<size_t>((entries_ - 1) / kStride + 1));
}

uint64_t DocumentIndex::length(uint64_t s) const {
  return static_cast<uint64_t>(load_le<int32_t>(idx_->data() + lengths_at_ + 4 * s));
}

uint64_t DocumentIndex::entry_sequence(uint64_t e) const {
  return static_cast<uint64_t>(load_le<int64_t>(idx_->data() + entries_at_ + 8 * e));
}

void DocumentIndex::add_sequence(uint64_t s, uint64_t stream_position) {
  MOEPEAK_CHECK(!complete_ && s >= first_ && s <= sequences_, "sequence ", s,
                " added to the document index of ", idx_->path());
  if ((s - first_) % kStride == 0) {
    MOEPEAK_CHECK(sequence_positions_.size() == (s - first_) / kStride, "sequence ", s,
                  " added out of order to the document index of ", idx_->path());
    sequence_positions_.push_back(stream_position);
  }
  // NOTES: the entries are non-decreasing and lie in [first, S], so every recorded entry's
  // sequence comes by as s runs from first to S.
  while (next_recorded_ < entries_ && next_recorded_sequence_ == s) {
    document_positions_.push_back(stream_position);
    next_recorded_ += kStride;
    if (next_recorded_ < entries_) next_recorded_sequence_ = entry_sequence(next_recorded_);
  }
  if (s == sequences_) {
    MOEPEAK_CHECK(next_recorded_ >= entries_ &&
                      sequence_positions_.size() == (sequences_ - first_) / kStride + 1,
                  "the document index of ", idx_->path(), " missed sequences");
    complete_ = true;
    stream_tokens_ = stream_position;
  }
}

uint64_t DocumentIndex::sequence_position(uint64_t s) const {
  const uint64_t k = (s - first_) / kStride;
  uint64_t position = sequence_positions_[static_cast<size_t>(k)];
  for (uint64_t j = first_ + k * kStride; j < s; ++j) position += length(j);
  return position;
}

uint64_t DocumentIndex::position_after(uint64_t from, uint64_t from_position, uint64_t to) const {
  if (to - from > kStride) return sequence_position(to);
  for (uint64_t j = from; j < to; ++j) from_position += length(j);
  return from_position;
}

uint64_t DocumentIndex::first_entry_at_or_after(uint64_t at) const {
  const auto k = static_cast<uint64_t>(
      std::lower_bound(document_positions_.begin(), document_positions_.end(), at) -
      document_positions_.begin());
  if (k == 0) return 0;  // entry 0 starts at 0, so `at` is 0
  // Entry (k - 1) * kStride starts before `at`; entry k * kStride, or the last entry (at N > at),
  // at or after it.
  uint64_t lo = (k - 1) * kStride + 1;
  uint64_t hi = k < document_positions_.size() ? k * kStride : entries_ - 1;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (sequence_position(entry_sequence(mid)) >= at) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

void DocumentIndex::append_starts(uint64_t lo, uint64_t hi, uint64_t lo_offset,
                                  std::vector<int64_t>& out) const {
  uint64_t e = first_entry_at_or_after(lo);
  uint64_t s = entry_sequence(e);
  uint64_t position = sequence_position(s);
  bool any = false;
  uint64_t last = 0;
  while (position <= hi) {
    if (!any || position != last) out.push_back(static_cast<int64_t>(lo_offset + (position - lo)));
    any = true;
    last = position;
    // The last entry starts at N > hi, so the walk ends before it (unless the .idx changed).
    MOEPEAK_CHECK_INPUT(e + 1 < entries_, idx_->path(),
                        ": the document index ends before position ", hi);
    const uint64_t next = entry_sequence(++e);
    position = position_after(s, position, next);
    s = next;
  }
}

void DocumentIndex::starts(uint64_t begin, uint64_t count, std::vector<int64_t>& offsets) const {
  MOEPEAK_CHECK(complete_, "a document index queried before all its sequences were added");
  const uint64_t N = stream_tokens_;
  MOEPEAK_CHECK(count <= N, "document starts in ", count, " positions of a stream of ", N);
  if (count == 0) return;
  const uint64_t b = begin % N;
  // Offset o is stream position b + o, or b + o - N once the range runs past the end.
  if (b + 1 < N) append_starts(b + 1, std::min(b + count, N - 1), 1, offsets);
  if (b + count >= N) append_starts(0, b + count - N, N - b, offsets);
}

// ---- TokenDataset -------------------------------------------------------------------------------

TokenDataset::TokenDataset(MappedFile file, TokenStorage storage, LoaderKind kind,
                           std::string format, uint64_t data_begin, const std::vector<Run>& runs,
                           DocumentIndex documents)
    : file_(std::move(file)),
      storage_(storage),
      kind_(kind),
      format_(std::move(format)),
      data_begin_(data_begin),
      documents_(std::move(documents)) {
  const uint64_t element = token_storage_size(storage_);
  for (const Run& run : runs) {
    if (run.byte_offset > file_.size() || run.tokens > (file_.size() - run.byte_offset) / element) {
      MOEPEAK_INPUT_ERROR(path(), ": ", run.tokens, " tokens at byte ", run.byte_offset,
                          " run past the end of the file (", file_.size(), " bytes)");
    }
    if (run.tokens == 0) continue;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (last.byte_offset + last.tokens * element == run.byte_offset) {
        last.tokens += run.tokens;
        token_count_ += run.tokens;
        continue;
      }
    }
    runs_.push_back(Run{token_count_, run.byte_offset, run.tokens});
    token_count_ += run.tokens;
  }
  MOEPEAK_CHECK(!documents_.present() || documents_.stream_tokens() == token_count_, path(),
                ": a document index over ", documents_.stream_tokens(), " tokens for a stream of ",
                token_count_);
}

void TokenDataset::document_starts(uint64_t begin, uint64_t count,
                                   std::vector<int64_t>& offsets) const {
  MOEPEAK_CHECK(has_document_index(), "document starts of ", path(),
                ", which has no document index");
  documents_.starts(begin, count, offsets);
}

void TokenDataset::bad_token(int64_t id, uint64_t byte, int64_t vocab_size) const {
  const uint64_t offset = (byte - data_begin_) / token_storage_size(storage_);
  if (id < 0) {
    MOEPEAK_INPUT_ERROR(path(), ": token ", id, " at offset ", offset, " (byte ", byte,
                        ") is negative");
  }
  MOEPEAK_INPUT_ERROR(path(), ": token ", id, " at offset ", offset, " (byte ", byte,
                      ") is >= model.vocab_size ", vocab_size);
}

void TokenDataset::read_cyclic(uint64_t begin, uint64_t count, int64_t* out,
                               int64_t vocab_size) const {
  MOEPEAK_CHECK(token_count_ > 0, "reading from an empty token dataset ", path());
  const uint64_t element = token_storage_size(storage_);
  uint64_t position = begin % token_count_;
  with_storage_type(storage_, [&](auto type_tag) {
    using T = decltype(type_tag);
    // The run holding `position`: the last one starting at or before it.
    auto run = std::upper_bound(runs_.begin(), runs_.end(), position,
                                [](uint64_t pos, const Run& r) { return pos < r.stream_begin; }) -
               1;
    while (count > 0) {
      const uint64_t within = position - run->stream_begin;
      const uint64_t take = std::min(count, run->tokens - within);
      const uint8_t* src = file_.data() + run->byte_offset + within * element;
      for (uint64_t i = 0; i < take; ++i) {
        const int64_t id = static_cast<int64_t>(load_le<T>(src + i * element));
        // NOTES: the vocabulary check of every token read (no scan at open: O(1) start-up).
        if (id < 0 || id >= vocab_size) {
          bad_token(id, run->byte_offset + (within + i) * element, vocab_size);
        }
        *out++ = id;
      }
      count -= take;
      position += take;
      if (++run == runs_.end()) {
        run = runs_.begin();
        position = 0;
      }
    }
  });
}

// ---- llm.c / nanoGPT .bin -----------------------------------------------------------------------

namespace {

constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
constexpr int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 tokens
constexpr int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 tokens

TokenDataset open_headerless_bin(MappedFile file, TokenStorage storage) {
  const size_t element = token_storage_size(storage);
  if (file.size() % element != 0) {
    MOEPEAK_INPUT_ERROR(file.path(), ": size ", file.size(), " bytes is not a whole number of ",
                        token_storage_name(storage), " tokens (", element, " bytes each)");
  }
  const uint64_t tokens = file.size() / element;
  std::string format = detail::concat("headerless ", token_storage_name(storage), " .bin");
  return TokenDataset(std::move(file), storage, LoaderKind::bin, std::move(format), 0,
                      {{0, 0, tokens}});
}

TokenDataset open_llmc_bin(MappedFile file) {
  if (file.size() < kLlmcHeaderBytes) {
    MOEPEAK_INPUT_ERROR(file.path(), ": truncated llm.c header: the file has ", file.size(),
                        " bytes, the header alone is ", kLlmcHeaderBytes);
  }
  const int32_t magic = load_le<int32_t>(file.data());
  const int32_t version = load_le<int32_t>(file.data() + 4);
  const int32_t declared = load_le<int32_t>(file.data() + 8);
  TokenStorage storage;
  std::string model;
  if (magic == kLlmcMagicGpt2) {
    if (version != 1) {
      MOEPEAK_INPUT_ERROR(file.path(), ": unsupported llm.c version ", version, " for magic ",
                          magic, " (expected 1: uint16 tokens)");
    }
    storage = TokenStorage::u16;
    model = "gpt-2";
  } else if (magic == kLlmcMagicLlama3) {
    if (version != 7) {
      MOEPEAK_INPUT_ERROR(file.path(), ": unsupported llm.c version ", version, " for magic ",
                          magic, " (expected 7: uint32 tokens)");
    }
    storage = TokenStorage::u32;
    model = "llama-3";
  } else {
    MOEPEAK_INPUT_ERROR(file.path(), ": bad llm.c magic ", magic, " at byte 0 (expected ",
                        kLlmcMagicGpt2, " or ", kLlmcMagicLlama3,
                        "); for a headerless file set training.token_dtype to uint16 or uint32");
  }
  if (declared < 0) {
    MOEPEAK_INPUT_ERROR(file.path(), ": llm.c header token count ", declared,
                        " (int32 at byte 8) is negative");
  }
  const size_t element = token_storage_size(storage);
  const uint64_t payload = file.size() - kLlmcHeaderBytes;
  if (payload % element != 0) {
    MOEPEAK_INPUT_ERROR(file.path(), ": ", payload, " bytes after the ", kLlmcHeaderBytes,
                        "-byte header are not a whole number of ", token_storage_name(storage),
                        " tokens (", element, " bytes each)");
  }
  if (payload / element != static_cast<uint64_t>(declared)) {
    MOEPEAK_INPUT_ERROR(file.path(), ": the header says ", declared, " tokens (",
                        static_cast<uint64_t>(declared) * element, " bytes after the ",
                        kLlmcHeaderBytes, "-byte header) but the file has ", payload,
                        " bytes after the header");
  }
  std::string format = detail::concat("llm.c ", model, " .bin (", token_storage_name(storage), ")");
  return TokenDataset(std::move(file), storage, LoaderKind::bin, std::move(format),
                      kLlmcHeaderBytes, {{0, kLlmcHeaderBytes, static_cast<uint64_t>(declared)}});
}

}  // namespace

TokenDataset open_token_bin(const std::string& path, TokenDtype token_dtype) {
  MappedFile file(path);
  switch (token_dtype) {
    case TokenDtype::uint16:
      return open_headerless_bin(std::move(file), TokenStorage::u16);
    case TokenDtype::uint32:
      return open_headerless_bin(std::move(file), TokenStorage::u32);
    case TokenDtype::llmc:
      return open_llmc_bin(std::move(file));
  }
  MOEPEAK_INPUT_ERROR(path, ": unknown token dtype");
}

// ---- Megatron .bin/.idx -------------------------------------------------------------------------

namespace {

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D

TokenStorage megatron_storage(uint8_t code, const std::string& idx_path) {
  switch (code) {
    case 1:
      return TokenStorage::u8;
    case 2:
      return TokenStorage::i8;
    case 3:
      return TokenStorage::i16;
    case 4:
      return TokenStorage::i32;
    case 5:
      return TokenStorage::i64;
    case 8:
      return TokenStorage::u16;
    case 6:
    case 7:
      MOEPEAK_INPUT_ERROR(idx_path, ": dtype code ", int(code),
                          " (byte 17) is a floating-point type (",
                          code == 6 ? "float64" : "float32", "), not token ids");
    default:
      MOEPEAK_INPUT_ERROR(
          idx_path, ": unknown dtype code ", int(code),
          " (byte 17; expected 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64 or 8 uint16)");
  }
}

std::string strip_suffix(const std::string& path, std::string_view suffix) {
  if (path.size() >= suffix.size() &&
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return path.substr(0, path.size() - suffix.size());
  }
  return path;
}

}  // namespace

TokenDataset open_megatron_dataset(const std::string& path) {
  std::string prefix = strip_suffix(strip_suffix(path, ".bin"), ".idx");
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  MappedFile idx(idx_path);
  MappedFile bin(bin_path);

  const uint8_t* p = idx.data();
  if (idx.size() < kMegatronHeaderBytes) {
    MOEPEAK_INPUT_ERROR(idx_path, ": truncated index header: the file has ", idx.size(),
                        " bytes, the header is ", kMegatronHeaderBytes);
  }
  if (std::memcmp(p, kMegatronMagic, sizeof(kMegatronMagic)) != 0) {
    MOEPEAK_INPUT_ERROR(idx_path,
                        ": bad magic at byte 0 (expected \"MMIDIDX\\x00\\x00\", a Megatron "
                        "indexed dataset index)");
  }
  const uint64_t version = load_le<uint64_t>(p + 9);
  if (version != 1)
    MOEPEAK_INPUT_ERROR(idx_path, ": unsupported index version ", version, " (byte 9; expected 1)");
  const TokenStorage storage = megatron_storage(p[17], idx_path);
  const uint64_t element = token_storage_size(storage);
  const uint64_t sequences = load_le<uint64_t>(p + 18);
  const uint64_t documents = load_le<uint64_t>(p + 26);
  const uint64_t available = idx.size() - kMegatronHeaderBytes;
  if (sequences > available / 12 || documents > available / 8 ||
      sequences * 12 + documents * 8 > available) {
    MOEPEAK_INPUT_ERROR(idx_path, ": truncated index: ", sequences, " sequences and ", documents,
                        " documents need ", kMegatronHeaderBytes, " + 12 * ", sequences, " + 8 * ",
                        documents, " bytes, the file has ", idx.size());
  }
  const uint64_t lengths_at = kMegatronHeaderBytes;
  const uint64_t pointers_at = lengths_at + 4 * sequences;
  const uint64_t documents_at = pointers_at + 8 * sequences;

  if (bin.size() % element != 0) {
    MOEPEAK_INPUT_ERROR(bin_path, ": size ", bin.size(), " bytes is not a whole number of ",
                        token_storage_name(storage), " tokens (", element, " bytes each)");
  }

  // The document index: where each document's sequences start, ending with S.
  if (documents == 0)
    MOEPEAK_INPUT_ERROR(idx_path,
                        ": the document index is empty (it ends with the sequence count)");
  int64_t previous = 0;
  for (uint64_t d = 0; d < documents; ++d) {
    const int64_t start = load_le<int64_t>(p + documents_at + 8 * d);
    if (start < previous || static_cast<uint64_t>(start) > sequences) {
      MOEPEAK_INPUT_ERROR(idx_path, ": document index entry ", d, " (byte ", documents_at + 8 * d,
                          ") is ", start, ", expected non-decreasing values in [0, ", sequences,
                          "]");
    }
    previous = start;
  }
  if (static_cast<uint64_t>(previous) != sequences) {
    MOEPEAK_INPUT_ERROR(idx_path, ": the document index ends at ", previous,
                        ", expected the sequence count ", sequences);
  }
  const uint64_t first_sequence = static_cast<uint64_t>(load_le<int64_t>(p + documents_at));

  // The index keeps the .idx mapped (p stays valid: the mapping moves, not its address) and
  // builds its sparse tables as the loop below reaches each sequence.
  DocumentIndex document_index(std::move(idx), sequences, documents, lengths_at, documents_at);
  uint64_t stream_position = 0;
  std::vector<TokenDataset::Run> runs;
  runs.reserve(static_cast<size_t>(sequences - first_sequence));
  for (uint64_t s = first_sequence; s < sequences; ++s) {
    const int32_t length = load_le<int32_t>(p + lengths_at + 4 * s);
    const int64_t pointer = load_le<int64_t>(p + pointers_at + 8 * s);
    if (length < 0) {
      MOEPEAK_INPUT_ERROR(idx_path, ": sequence ", s, " has negative length ", length, " (byte ",
                          lengths_at + 4 * s, ")");
    }
    if (pointer < 0 || static_cast<uint64_t>(pointer) % element != 0) {
      MOEPEAK_INPUT_ERROR(idx_path, ": sequence ", s, " has pointer ", pointer, " (byte ",
                          pointers_at + 8 * s, "), expected a non-negative multiple of ", element);
    }
    const uint64_t begin = static_cast<uint64_t>(pointer);
    if (begin > bin.size() || static_cast<uint64_t>(length) > (bin.size() - begin) / element) {
      MOEPEAK_INPUT_ERROR(idx_path, ": sequence ", s, " (", length, " tokens at byte ", begin,
                          ") runs past the end of ", bin_path, " (", bin.size(), " bytes)");
    }
    runs.push_back({0, begin, static_cast<uint64_t>(length)});
    document_index.add_sequence(s, stream_position);
    stream_position += static_cast<uint64_t>(length);
  }
  document_index.add_sequence(sequences, stream_position);
  std::string format =
      detail::concat("Megatron indexed dataset (", token_storage_name(storage), ", ", documents - 1,
                     " documents, ", sequences, " sequences)");
  return TokenDataset(std::move(bin), storage, LoaderKind::megatron, std::move(format), 0, runs,
                      std::move(document_index));
}

TokenDataset open_token_dataset(DatasetKind kind, const std::string& path, TokenDtype token_dtype) {
  MOEPEAK_CHECK(kind != DatasetKind::copy, "open_token_dataset of the copy task");
  return kind == DatasetKind::bin ? open_token_bin(path, token_dtype) : open_megatron_dataset(path);
}

void check_same_token_type(const TokenDataset& first, const std::string& first_role,
                           const TokenDataset& other, const std::string& other_role) {
  if (other.storage() == first.storage()) return;
  MOEPEAK_INPUT_ERROR(other_role, " ", other.path(), " stores ",
                      token_storage_name(other.storage()), " token ids, but ", first_role, " ",
                      first.path(), " stores ", token_storage_name(first.storage()),
                      ": the datasets of a run must hold one tokenizer's ids in one token type");
}

}  // namespace moepeak
