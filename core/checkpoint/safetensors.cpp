// The safetensors writer and validating reader; the format is described in safetensors.h.
#include "core/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is written from memory as is");

namespace moepeak {

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit of the reference implementation

struct DTypeSpelling {
  std::string_view name;
  size_t element_size;
};
constexpr DTypeSpelling kKnownDTypes[] = {
    {"F32", 4}, {"F64", 8}, {"BF16", 2}, {"F16", 2},
    {"I32", 4}, {"I64", 8}, {"U8", 1},   {"F8_E4M3", 1},
};

// product(shape), or nullopt on a negative dimension or overflow past 2^62.
std::optional<int64_t> element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && count > (int64_t{1} << 62) / d) return std::nullopt;
    count *= d;
  }
  return count;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool read_exactly(int fd, void* dst, size_t bytes, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    if (safetensors_dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

size_t safetensors_element_size(std::string_view name) {
  for (const DTypeSpelling& known : kKnownDTypes) {
    if (known.name == name) return known.element_size;
  }
  return 0;
}

namespace {

// IEEE binary16 -> binary32, exactly (subnormals, infinities and NaNs included).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: m * 2^-24; normalise the mantissa.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Loads element i of a buffer of `Source` (float, or the bits of a bf16 / f16) as a float.
template <typename Source, float (*widen)(uint16_t)>
float load_as_float(const uint8_t* p, size_t i) {
  Source v;
  std::memcpy(&v, p + i * sizeof(Source), sizeof(Source));
  if constexpr (std::is_same_v<Source, float>) {
    return v;
  } else {
    return widen(v);
  }
}

float no_widen(uint16_t) { return 0; }

template <float (*load)(const uint8_t*, size_t)>
void convert_loop(const uint8_t* in, uint8_t* out, bool to_f32, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float f = load(in, i);
    if (to_f32) {
      std::memcpy(out + 4 * i, &f, 4);
    } else {
      const uint16_t b = bf16::from_float(f);
      std::memcpy(out + 2 * i, &b, 2);
    }
  }
}

}  // namespace

void convert_float_elements(const void* src, std::string_view from, void* dst, std::string_view to,
                            size_t count) {
  const bool from_ok = from == "F32" || from == "BF16" || from == "F16";
  if (!from_ok || !(to == "F32" || to == "BF16")) {
    MOEPEAK_THROW("convert_float_elements: cannot convert ", from, " to ", to);
  }
  if (from == to) {
    std::memcpy(dst, src, count * safetensors_element_size(from));
    return;
  }
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  const bool to_f32 = to == "F32";
  if (from == "F32") {
    convert_loop<load_as_float<float, no_widen>>(in, out, to_f32, count);
  } else if (from == "BF16") {
    convert_loop<load_as_float<uint16_t, bf16::to_float>>(in, out, to_f32, count);
  } else {
    convert_loop<load_as_float<uint16_t, half_to_float>>(in, out, to_f32, count);
  }
}

int64_t SafetensorsTensorInfo::elements() const { return element_count(shape).value_or(0); }

// ---- Writer -------------------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, size_t bytes) {
  add(name, safetensors_dtype_name(dtype), shape, data, bytes);
}

void SafetensorsWriter::add(const std::string& name, std::string_view dtype,
                            const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  const size_t expected = checked_bytes(name, dtype, shape);
  if (expected != bytes) {
    MOEPEAK_THROW("safetensors: tensor \"", name, "\": shape ", shape_text(shape), " of ", dtype,
                  " is ", expected, " bytes, but ", bytes, " bytes were given");
  }
  if (bytes > 0 && data == nullptr) MOEPEAK_THROW("safetensors: tensor \"", name, "\": null data");
  tensors_.push_back(Entry{name, std::string(dtype), shape, data, {}, bytes, data_bytes_});
  data_bytes_ += bytes;
}

void SafetensorsWriter::add_streamed(const std::string& name, std::string_view dtype,
                                     const std::vector<int64_t>& shape,
                                     std::function<void(FileSink&)> produce) {
  const size_t bytes = checked_bytes(name, dtype, shape);
  tensors_.push_back(
      Entry{name, std::string(dtype), shape, nullptr, std::move(produce), bytes, data_bytes_});
  data_bytes_ += bytes;
}

size_t SafetensorsWriter::checked_bytes(const std::string& name, std::string_view dtype,
                                        const std::vector<int64_t>& shape) const {
  if (name.empty()) MOEPEAK_THROW("safetensors: a tensor needs a name");
  if (name == kMetadataKey) MOEPEAK_THROW("safetensors: \"", name, "\" is reserved for metadata");
  for (const Entry& e : tensors_) {
    if (e.name == name) MOEPEAK_THROW("safetensors: tensor \"", name, "\" added twice");
  }
  const size_t element = safetensors_element_size(dtype);
  if (element == 0) {
    MOEPEAK_THROW("safetensors: tensor \"", name, "\": unknown dtype \"", dtype,
                  "\" (this build writes F32 F64 BF16 F16 I32 I64 U8 F8_E4M3)");
  }
  std::optional<int64_t> count = element_count(shape);
  if (!count) MOEPEAK_THROW("safetensors: tensor \"", name, "\": bad shape ", shape_text(shape));
  return static_cast<size_t>(*count) * element;
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::string SafetensorsWriter::header_json() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  for (const Entry& e : tensors_) {
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.begin + e.bytes}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {  // e.g. a name that is not valid UTF-8
    MOEPEAK_THROW("safetensors: cannot encode the header: ", ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::string header;
  try {
    header = header_json();
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR(path, ": ", e.message());
  }
  write_file_atomically(path, [&](FileSink& out) {
    uint8_t size_bytes[8];
    const uint64_t header_size = header.size();
    std::memcpy(size_bytes, &header_size, 8);
    out.write(size_bytes, 8);
    out.write(header);
    for (const Entry& e : tensors_) {
      if (!e.produce) {
        out.write(e.data, e.bytes);
        continue;
      }
      const size_t before = out.bytes_written();
      e.produce(out);
      if (out.bytes_written() - before != e.bytes) {
        MOEPEAK_THROW(path, ": tensor \"", e.name, "\" was streamed as ",
                      out.bytes_written() - before, " bytes, its header says ", e.bytes);
      }
    }
  });
}

// ---- Reader -------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      names_(std::move(other.names_)),
      infos_(std::move(other.infos_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    names_ = std::move(other.names_);
    infos_ = std::move(other.infos_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd_ < 0) MOEPEAK_INPUT_ERROR(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0)
    MOEPEAK_INPUT_ERROR(path, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) MOEPEAK_INPUT_ERROR(path, ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  uint64_t header_size = 0;
  if (file_size < 8 || !read_exactly(file.fd_, &header_size, 8, 0)) {
    MOEPEAK_INPUT_ERROR(path, ": truncated: ", file_size,
                        " bytes, too short for the 8-byte header size");
  }
  if (header_size > file_size - 8) {
    MOEPEAK_INPUT_ERROR(path, ": header size ", header_size, " runs past the end of the file (",
                        file_size, " bytes)");
  }
  if (header_size > kMaxHeaderBytes) {
    MOEPEAK_INPUT_ERROR(path, ": header size ", header_size, " is over the ", kMaxHeaderBytes,
                        "-byte limit");
  }
  std::string text(header_size, '\0');
  errno = 0;
  if (!read_exactly(file.fd_, text.data(), header_size, 8)) {
    MOEPEAK_INPUT_ERROR(path, ": cannot read the ", header_size, "-byte header",
                        errno ? ": " : " (file shrank?)", errno ? std::strerror(errno) : "");
  }
  const uint64_t data_begin = 8 + header_size;
  const uint64_t data_size = file_size - data_begin;

  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MOEPEAK_INPUT_ERROR(path, ": the header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) MOEPEAK_INPUT_ERROR(path, ": the header is not a JSON object");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) MOEPEAK_INPUT_ERROR(path, ": \"__metadata__\" is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          MOEPEAK_INPUT_ERROR(path, ": metadata \"", key, "\" is not a string");
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    auto where = [&, &name = name] { return detail::concat(path, ": tensor \"", name, "\""); };
    if (!entry.is_object()) MOEPEAK_INPUT_ERROR(where(), ": entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) MOEPEAK_INPUT_ERROR(where(), ": missing \"", field, "\"");
    }
    SafetensorsTensorInfo info;
    if (!entry.at("dtype").is_string()) MOEPEAK_INPUT_ERROR(where(), ": \"dtype\" is not a string");
    info.dtype = entry.at("dtype").get<std::string>();
    const size_t element = safetensors_element_size(info.dtype);
    if (element == 0) {
      MOEPEAK_INPUT_ERROR(where(), ": unknown dtype \"", info.dtype,
                          "\" (this build reads F32 F64 BF16 F16 I32 I64 U8 F8_E4M3)");
    }
    const auto& shape = entry.at("shape");
    if (!shape.is_array()) MOEPEAK_INPUT_ERROR(where(), ": \"shape\" is not an array");
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        MOEPEAK_INPUT_ERROR(where(), ": \"shape\" ", shape.dump(),
                            " has an entry that is not a non-negative integer");
      info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    const auto& offsets = entry.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      MOEPEAK_INPUT_ERROR(where(), ": \"data_offsets\" ", offsets.dump(),
                          " is not [begin, end] of non-negative integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end)
      MOEPEAK_INPUT_ERROR(where(), ": data_offsets [", begin, ", ", end, "] end before they begin");
    if (end > data_size) {
      MOEPEAK_INPUT_ERROR(where(), ": data_offsets [", begin, ", ", end,
                          "] are out of range: the data section has ", data_size, " bytes");
    }
    // NOTES: count <= 2^62 and count * element may pass 2^64: compared by division first, so a
    // shape such as [2^62] of F64 cannot wrap to the 0 bytes of an empty range (tests/fuzz).
    std::optional<int64_t> count = element_count(info.shape);
    if (!count || static_cast<uint64_t>(*count) > (end - begin) / element ||
        static_cast<uint64_t>(*count) * element != end - begin) {
      const bool wraps = count && static_cast<uint64_t>(*count) > UINT64_MAX / element;
      MOEPEAK_INPUT_ERROR(where(), ": shape ", shape_text(info.shape), " of ", info.dtype,
                          " needs ",
                          count && !wraps ? std::to_string(static_cast<uint64_t>(*count) * element)
                                          : std::string("over 2^62"),
                          " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin);
    }
    info.bytes = static_cast<size_t>(end - begin);
    info.file_offset = static_cast<size_t>(data_begin + begin);
    auto [it, inserted] = file.infos_.emplace(name, std::move(info));
    if (!inserted) MOEPEAK_INPUT_ERROR(where(), ": listed twice");
    file.names_.push_back(name);
    if (end > begin) ranges.push_back(Range{begin, end, &it->first});
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      MOEPEAK_INPUT_ERROR(path, ": tensors \"", *ranges[i - 1].name, "\" [", ranges[i - 1].begin,
                          ", ", ranges[i - 1].end, ") and \"", *ranges[i].name, "\" [",
                          ranges[i].begin, ", ", ranges[i].end, ") overlap");
    }
  }
  return file;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) MOEPEAK_INPUT_ERROR(path_, ": no tensor \"", name, "\"");
  return it->second;
}

void SafetensorsFile::read(const std::string& name, void* dst, size_t bytes) const {
  const SafetensorsTensorInfo& t = info(name);
  if (bytes != t.bytes) {
    MOEPEAK_INPUT_ERROR(path_, ": tensor \"", name, "\" (", t.dtype, " ", shape_text(t.shape),
                        ") is ", t.bytes, " bytes, the destination is ", bytes);
  }
  if (bytes == 0) return;
  errno = 0;
  if (!read_exactly(fd_, dst, bytes, t.file_offset)) {
    MOEPEAK_INPUT_ERROR(path_, ": tensor \"", name, "\": cannot read ", bytes, " bytes at byte ",
                        t.file_offset, errno ? ": " : " (file shrank?)",
                        errno ? std::strerror(errno) : "");
  }
}

void SafetensorsFile::read_bytes(const std::string& name, size_t offset, void* dst,
                                 size_t bytes) const {
  const SafetensorsTensorInfo& t = info(name);
  if (offset > t.bytes || bytes > t.bytes - offset) {
    MOEPEAK_INPUT_ERROR(path_, ": tensor \"", name, "\" (", t.dtype, " ", shape_text(t.shape), ", ",
                        t.bytes, " bytes): bytes [", offset, ", ", offset + bytes,
                        ") are out of range");
  }
  if (bytes == 0) return;
  errno = 0;
  if (!read_exactly(fd_, dst, bytes, t.file_offset + offset)) {
    MOEPEAK_INPUT_ERROR(path_, ": tensor \"", name, "\": cannot read ", bytes, " bytes at byte ",
                        t.file_offset + offset, errno ? ": " : " (file shrank?)",
                        errno ? std::strerror(errno) : "");
  }
}

}  // namespace moepeak
