// The Event's wire form by hand (tensorboard_event.h).
#include "core/metrics/tensorboard_event.h"

#include <cstring>

namespace moepeak {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, field << 3 | type);
}

void put_fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLength);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// A cursor over the bytes of one message.
struct Reader {
  std::string_view in;
  bool ok = true;

  bool done() const { return in.empty() || !ok; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in.empty()) break;
      const auto byte = static_cast<unsigned char>(in.front());
      in.remove_prefix(1);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    ok = false;
    return 0;
  }
  uint64_t fixed(size_t bytes) {
    if (in.size() < bytes) return ok = false, 0;
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
    in.remove_prefix(bytes);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (!ok || n > in.size()) return ok = false, std::string_view{};
    std::string_view out = in.substr(0, n);
    in.remove_prefix(n);
    return out;
  }
  // Skips a field of `type` that is not ours.
  void skip(uint32_t type) {
    if (type == kVarint) {
      varint();
    } else if (type == kFixed64) {
      fixed(8);
    } else if (type == kLength) {
      bytes();
    } else if (type == kFixed32) {
      fixed(4);
    } else {
      ok = false;  // groups (3, 4) and unknown types: not an Event we read
    }
  }
};

bool decode_value(std::string_view bytes, TensorBoardScalar& out) {
  Reader r{bytes};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), type = static_cast<uint32_t>(key & 7);
    if (field == 1 && type == kLength) {
      out.tag = std::string(r.bytes());
    } else if (field == 2 && type == kFixed32) {
      const auto bits = static_cast<uint32_t>(r.fixed(4));
      float f;
      std::memcpy(&f, &bits, 4);
      out.value = f;
    } else {
      r.skip(type);
    }
  }
  return r.ok;
}

}  // namespace

std::string encode_event(const EventRecord& e) {
  std::string out;
  if (e.wall_time != 0) {
    uint64_t bits;
    std::memcpy(&bits, &e.wall_time, 8);
    put_key(out, 1, kFixed64);
    put_fixed(out, bits, 8);
  }
  if (e.step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, static_cast<uint64_t>(e.step));  // int64: a negative is ten bytes
  }
  if (e.has_file_version) {
    put_bytes(out, 3, e.file_version);
    return out;
  }
  std::string summary;
  for (const TensorBoardScalar& s : e.scalars) {
    std::string value;
    if (!s.tag.empty()) put_bytes(value, 1, s.tag);
    const float f = static_cast<float>(s.value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put_key(value, 2, kFixed32);
    put_fixed(value, bits, 4);
    put_bytes(summary, 1, value);
  }
  put_bytes(out, 5, summary);
  return out;
}

bool try_decode_event(std::string_view bytes, EventRecord& out) {
  out = EventRecord{};
  Reader r{bytes};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), type = static_cast<uint32_t>(key & 7);
    if (field == 1 && type == kFixed64) {
      const uint64_t bits = r.fixed(8);
      std::memcpy(&out.wall_time, &bits, 8);
    } else if (field == 2 && type == kVarint) {
      out.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && type == kLength) {
      out.has_file_version = true;
      out.file_version = std::string(r.bytes());
    } else if (field == 5 && type == kLength) {
      Reader summary{r.bytes()};
      while (r.ok && !summary.done()) {
        const uint64_t k = summary.varint();
        if (k == (1u << 3 | kLength)) {
          TensorBoardScalar s;
          if (!decode_value(summary.bytes(), s)) return false;
          out.scalars.push_back(std::move(s));
        } else {
          summary.skip(static_cast<uint32_t>(k & 7));
        }
      }
      if (!summary.ok) return false;
    } else {
      r.skip(type);
    }
  }
  return r.ok;
}

}  // namespace moepeak
