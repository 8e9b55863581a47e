// MegatronWriter: see megatron_writer.h.
#include "core/data/megatron_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/atomic_file.h"
#include "core/error.h"

namespace moepeak {

namespace {

template <typename T>
void append_le(std::vector<uint8_t>& out, T value) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts only, as the format is
  out.insert(out.end(), raw, raw + sizeof(T));
}

uint8_t megatron_code(TokenStorage storage) {
  switch (storage) {
    case TokenStorage::u16:
      return 8;
    case TokenStorage::i32:
      return 4;
    default:
      MOEPEAK_THROW("MegatronWriter writes uint16 or int32 tokens, not ",
                    token_storage_name(storage));
  }
}

}  // namespace

TokenStorage megatron_token_storage(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenStorage::u16 : TokenStorage::i32;
}

MegatronWriter::MegatronWriter(std::string prefix, TokenStorage storage)
    : prefix_(std::move(prefix)), storage_(storage) {
  megatron_code(storage_);  // checks the storage
  bin_temp_ = prefix_ + ".bin.tmp." + std::to_string(::getpid());
  fd_ = ::open(bin_temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    MOEPEAK_INPUT_ERROR(prefix_, ".bin: cannot create it (", bin_temp_,
                        "): ", std::strerror(errno));
  }
}

MegatronWriter::~MegatronWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(bin_temp_.c_str());
}

void MegatronWriter::write_bytes(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      MOEPEAK_INPUT_ERROR(prefix_, ".bin: write failed after ", bin_bytes(),
                          " bytes: ", std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void MegatronWriter::add_document(std::span<const int32_t> ids) {
  MOEPEAK_CHECK(!committed_, "MegatronWriter::add_document after commit");
  MOEPEAK_CHECK(!ids.empty(), "an empty document");
  MOEPEAK_CHECK(ids.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "a document of ", ids.size(), " tokens (Megatron's lengths are int32)");
  encoded_.clear();
  for (int32_t id : ids) {
    if (storage_ == TokenStorage::u16) {
      if (id < 0 || id > 0xffff) {
        MOEPEAK_INPUT_ERROR(prefix_, ".bin: document ", lengths_.size(), " has token id ", id,
                            ", which does not fit uint16");
      }
      append_le<uint16_t>(encoded_, static_cast<uint16_t>(id));
    } else {
      append_le<int32_t>(encoded_, id);
    }
  }
  write_bytes(encoded_.data(), encoded_.size());
  lengths_.push_back(static_cast<int32_t>(ids.size()));
  tokens_ += ids.size();
}

void MegatronWriter::commit() {
  MOEPEAK_CHECK(!committed_, "MegatronWriter::commit twice");
  if (::fsync(fd_) != 0) MOEPEAK_INPUT_ERROR(prefix_, ".bin: fsync failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  const uint64_t S = lengths_.size();
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  append_le<uint64_t>(idx, 1);  // version
  idx.push_back(megatron_code(storage_));
  append_le<uint64_t>(idx, S);      // sequences
  append_le<uint64_t>(idx, S + 1);  // document index entries
  for (int32_t length : lengths_) append_le<int32_t>(idx, length);
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    append_le<int64_t>(idx, pointer);
    pointer += static_cast<int64_t>(length) * static_cast<int64_t>(token_storage_size(storage_));
  }
  for (uint64_t d = 0; d <= S; ++d) append_le<int64_t>(idx, static_cast<int64_t>(d));
  write_file_atomically(prefix_ + ".idx",
                        std::string_view(reinterpret_cast<const char*>(idx.data()), idx.size()));
  const std::string bin = prefix_ + ".bin";
  if (std::rename(bin_temp_.c_str(), bin.c_str()) != 0)
    MOEPEAK_INPUT_ERROR(bin, ": cannot move ", bin_temp_, " into place: ", std::strerror(errno));
  committed_ = true;
}

}  // namespace moepeak
