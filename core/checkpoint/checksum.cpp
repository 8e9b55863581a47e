#include "core/checkpoint/checksum.h"

#include <xxhash.h>  // defines: XXH3_64bits, XXH3_state_t and its streaming calls

#include <cstdio>

#include "core/error.h"

namespace moepeak {

uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

struct Xxh3Stream::State {
  XXH3_state_t* s = nullptr;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  MOEPEAK_CHECK(state_->s != nullptr, "XXH3_createState: out of memory");
  reset();
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(state_->s); }

void Xxh3Stream::update(const void* data, size_t bytes) {
  if (bytes == 0) return;
  MOEPEAK_CHECK(XXH3_64bits_update(state_->s, data, bytes) == XXH_OK, "XXH3_64bits_update failed");
}

uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(state_->s); }

void Xxh3Stream::reset() {
  MOEPEAK_CHECK(XXH3_64bits_reset(state_->s) == XXH_OK, "XXH3_64bits_reset failed");
}

std::string checksum_hex(uint64_t checksum) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

std::optional<uint64_t> parse_checksum_hex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace moepeak
