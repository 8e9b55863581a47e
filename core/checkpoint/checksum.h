// XXH3-64 checksums (Debian's libxxhash 0.8), for the blocks of a sharded checkpoint's files.
//
//   uint64_t h = xxh3_64(data, bytes);
//   Xxh3Stream s;  s.update(a, n);  s.update(b, m);  s.digest() == xxh3_64(a ++ b)
//   checksum_hex(h) == "0123456789abcdef" (16 lower-case hex digits); parse_checksum_hex inverts it
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moepeak {

uint64_t xxh3_64(const void* data, size_t bytes);

// Incremental XXH3-64 over a byte stream: the digest of everything updated since construction or
// the last reset() equals xxh3_64 of those bytes in one piece.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string checksum_hex(uint64_t checksum);
// nullopt unless `text` is exactly 16 hex digits.
std::optional<uint64_t> parse_checksum_hex(std::string_view text);

}  // namespace moepeak
