#include "core/checkpoint/shard_manifest.h"

#include <set>

#include "core/checkpoint/checksum.h"
#include "core/checkpoint/safetensors.h"
#include "core/error.h"

namespace moepeak {

int64_t ShardTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const ShardTensor& ShardManifest::tensor(std::string_view name, std::string_view where) const {
  for (const ShardTensor& t : tensors) {
    if (t.name == name) return t;
  }
  MOEPEAK_INPUT_ERROR(where, ": the checkpoint has no tensor '", name, "'");
}

bool ShardManifest::has_tensor(std::string_view name) const {
  for (const ShardTensor& t : tensors) {
    if (t.name == name) return true;
  }
  return false;
}

std::string ShardManifest::to_json() const {
  nlohmann::json files_json = nlohmann::json::array();
  for (const ShardFileInfo& f : files) files_json.push_back(shard_file_to_json(f));
  nlohmann::json tensors_json = nlohmann::json::array();
  for (const ShardTensor& t : tensors) {
    nlohmann::json slices = nlohmann::json::array();
    for (const ShardSlice& s : t.slices) {
      slices.push_back(
          {{"file", s.file}, {"offset", s.offset}, {"begin", s.begin}, {"end", s.end}});
    }
    tensors_json.push_back({{"name", t.name},
                            {"dtype", std::string(safetensors_dtype_name(t.dtype))},
                            {"shape", t.shape},
                            {"slices", std::move(slices)}});
  }
  nlohmann::json doc = {{"format", std::string(kShardManifestFormat)},
                        {"version", kShardManifestVersion},
                        {"block_bytes", block_bytes},
                        {"metadata", metadata},
                        {"files", std::move(files_json)},
                        {"tensors", std::move(tensors_json)}};
  // NOTES: written only when there are some, so that a checkpoint without carried files has the
  // manifest it always had (and an older build reads it).
  if (!carried.empty()) {
    nlohmann::json carried_json = nlohmann::json::array();
    for (const ShardFileInfo& f : carried) carried_json.push_back(shard_file_to_json(f));
    doc["carried_files"] = std::move(carried_json);
  }
  return doc.dump(1) + "\n";
}

namespace {

// The most bytes a tensor may have: its element count and byte count then fit in int64_t.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 62;

// The member `key` of `obj`, which must exist; `where` names the object for the message.
const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) {
    MOEPEAK_INPUT_ERROR(where, ": field \"", key, "\" is missing");
  }
  return obj.at(key);
}

template <typename T>
T number(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json& v = member(obj, key, where);
  if (!v.is_number_integer())
    MOEPEAK_INPUT_ERROR(where, ": field \"", key, "\" must be an integer");
  if constexpr (std::is_unsigned_v<T>) {
    if (v.is_number_unsigned() || v.get<int64_t>() >= 0) return v.get<T>();
    MOEPEAK_INPUT_ERROR(where, ": field \"", key, "\" must be >= 0, not ", v.get<int64_t>());
  } else {
    return v.get<T>();
  }
}

std::string text(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json& v = member(obj, key, where);
  if (!v.is_string()) MOEPEAK_INPUT_ERROR(where, ": field \"", key, "\" must be a string");
  return v.get<std::string>();
}

const nlohmann::json& array(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json& v = member(obj, key, where);
  if (!v.is_array()) MOEPEAK_INPUT_ERROR(where, ": field \"", key, "\" must be an array");
  return v;
}

}  // namespace

nlohmann::json shard_file_to_json(const ShardFileInfo& file) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const ShardBlock& b : file.blocks) blocks.push_back({b.bytes, checksum_hex(b.xxh3)});
  return {{"name", file.name}, {"bytes", file.bytes}, {"blocks", std::move(blocks)}};
}

ShardFileInfo shard_file_from_json(const nlohmann::json& f, const std::string& where) {
  ShardFileInfo info;
  info.name = text(f, "name", where);
  info.bytes = number<uint64_t>(f, "bytes", where);
  for (const nlohmann::json& b : array(f, "blocks", where)) {
    std::optional<uint64_t> sum;
    if (b.is_array() && b.size() == 2 && b[0].is_number_unsigned() && b[1].is_string()) {
      sum = parse_checksum_hex(b[1].get<std::string>());
    }
    if (!sum) {
      MOEPEAK_INPUT_ERROR(where, " (", info.name,
                          "): a block is not [bytes, \"16 hex digits of its XXH3-64\"]");
    }
    info.blocks.push_back({b[0].get<uint64_t>(), *sum});
  }
  return info;
}

ShardManifest ShardManifest::parse(std::string_view text_in, const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text_in);
  } catch (const nlohmann::json::exception& e) {
    MOEPEAK_INPUT_ERROR(path, ": not valid JSON (", e.what(), ")");
  }
  if (!doc.is_object()) MOEPEAK_INPUT_ERROR(path, ": a manifest is a JSON object");
  const std::string format = text(doc, "format", path);
  if (format != kShardManifestFormat) {
    MOEPEAK_INPUT_ERROR(path, ": format \"", format, "\" is not \"", kShardManifestFormat, "\"");
  }
  const int version = number<int>(doc, "version", path);
  if (version != kShardManifestVersion) {
    MOEPEAK_INPUT_ERROR(path, ": manifest version ", version, "; this build reads version ",
                        kShardManifestVersion);
  }
  ShardManifest m;
  m.block_bytes = number<uint64_t>(doc, "block_bytes", path);
  if (doc.contains("metadata")) {
    m.metadata = doc.at("metadata");
    if (!m.metadata.is_object())
      MOEPEAK_INPUT_ERROR(path, ": field \"metadata\" must be an object");
  }
  for (const nlohmann::json& f : array(doc, "files", path)) {
    m.files.push_back(
        shard_file_from_json(f, path + ": files[" + std::to_string(m.files.size()) + "]"));
  }
  for (const nlohmann::json& t : array(doc, "tensors", path)) {
    const std::string where = path + ": tensors[" + std::to_string(m.tensors.size()) + "]";
    ShardTensor tensor;
    tensor.name = text(t, "name", where);
    const std::string tensor_where = path + ": tensor '" + tensor.name + "'";
    const std::string dtype = text(t, "dtype", tensor_where);
    std::optional<DType> parsed = dtype_from_safetensors(dtype);
    if (!parsed)
      MOEPEAK_INPUT_ERROR(tensor_where, ": dtype \"", dtype, "\" is not one this build reads");
    tensor.dtype = *parsed;
    for (const nlohmann::json& d : array(t, "shape", tensor_where)) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        MOEPEAK_INPUT_ERROR(tensor_where, ": shape entries must be integers >= 0");
      }
      tensor.shape.push_back(d.get<int64_t>());
    }
    for (const nlohmann::json& s : array(t, "slices", tensor_where)) {
      ShardSlice slice;
      slice.file = number<int>(s, "file", tensor_where);
      slice.offset = number<uint64_t>(s, "offset", tensor_where);
      slice.begin = number<int64_t>(s, "begin", tensor_where);
      slice.end = number<int64_t>(s, "end", tensor_where);
      tensor.slices.push_back(slice);
    }
    m.tensors.push_back(std::move(tensor));
  }
  if (doc.contains("carried_files")) {
    for (const nlohmann::json& f : array(doc, "carried_files", path)) {
      m.carried.push_back(shard_file_from_json(
          f, path + ": carried_files[" + std::to_string(m.carried.size()) + "]"));
    }
  }
  m.validate(path);
  return m;
}

void ShardManifest::validate(const std::string& path) const {
  if (block_bytes == 0) MOEPEAK_INPUT_ERROR(path, ": block_bytes must be > 0");
  std::set<std::string> file_names;
  std::vector<const ShardFileInfo*> every_file;
  for (const ShardFileInfo& f : files) every_file.push_back(&f);
  for (const ShardFileInfo& f : carried) every_file.push_back(&f);
  for (const ShardFileInfo* file : every_file) {
    const ShardFileInfo& f = *file;
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." ||
        f.name == "..") {
      MOEPEAK_INPUT_ERROR(path, ": file name \"", f.name,
                          "\" is not a plain name in the directory");
    }
    if (!file_names.insert(f.name).second)
      MOEPEAK_INPUT_ERROR(path, ": file ", f.name, " listed twice");
    uint64_t covered = 0;
    for (const ShardBlock& b : f.blocks) {
      if (b.bytes == 0 || b.bytes > block_bytes) {
        MOEPEAK_INPUT_ERROR(path, ": file ", f.name, " has a block of ", b.bytes,
                            " bytes (blocks hold 1 to ", block_bytes, ")");
      }
      covered += b.bytes;
    }
    if (covered != f.bytes) {
      MOEPEAK_INPUT_ERROR(path, ": the checksum blocks of file ", f.name, " cover ", covered,
                          " bytes of its ", f.bytes);
    }
  }
  std::set<std::string> tensor_names;
  for (const ShardTensor& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (!tensor_names.insert(t.name).second) MOEPEAK_INPUT_ERROR(where, " is listed twice");
    const uint64_t es = dtype_size(t.dtype);
    // NOTES: the shape is checked before numel() multiplies it out: a damaged shape must be an
    // error, not a signed overflow, nor a byte count that wraps (tests/fuzz, shape_overflow.json).
    int64_t n = 1;
    for (const int64_t d : t.shape) {
      if (d < 0) MOEPEAK_INPUT_ERROR(where, ": shape entry ", d, " is negative");
      if (d != 0 && n > kMaxTensorBytes / static_cast<int64_t>(es) / d) {
        MOEPEAK_INPUT_ERROR(where, ": its shape (an entry ", d, ") makes it over 2^62 bytes");
      }
      n *= d;
    }
    int64_t covered = 0;
    for (const ShardSlice& s : t.slices) {
      if (s.begin != covered) {
        if (s.begin > covered) {
          MOEPEAK_INPUT_ERROR(where, ": elements [", covered, ", ", s.begin, ") of its ", n,
                              " are in no slice (the checkpoint does not cover the tensor)");
        }
        MOEPEAK_INPUT_ERROR(where, ": slices overlap or are out of order at element ", s.begin);
      }
      if (s.end <= s.begin)
        MOEPEAK_INPUT_ERROR(where, ": empty or reversed slice [", s.begin, ", ", s.end, ")");
      if (s.end > n) {
        MOEPEAK_INPUT_ERROR(where, ": slice [", s.begin, ", ", s.end, ") runs past its ", n,
                            " elements");
      }
      if (s.file < 0 || static_cast<size_t>(s.file) >= files.size()) {
        MOEPEAK_INPUT_ERROR(where, ": slice [", s.begin, ", ", s.end, ") names file index ", s.file,
                            " of ", files.size());
      }
      const ShardFileInfo& f = files[static_cast<size_t>(s.file)];
      if (s.offset % es != 0) {
        MOEPEAK_INPUT_ERROR(where, ": slice at byte ", s.offset, " of ", f.name,
                            " is not aligned to its ", es, "-byte elements");
      }
      const uint64_t bytes = static_cast<uint64_t>(s.end - s.begin) * es;
      if (s.offset > f.bytes || bytes > f.bytes - s.offset) {
        MOEPEAK_INPUT_ERROR(where, ": slice [", s.begin, ", ", s.end, ") at bytes [", s.offset,
                            ", ", s.offset + bytes, ") runs past the ", f.bytes, " bytes of ",
                            f.name);
      }
      covered = s.end;
    }
    if (covered != n) {
      MOEPEAK_INPUT_ERROR(where, ": elements [", covered, ", ", n, ") of its ", n,
                          " are in no slice (the checkpoint does not cover the tensor)");
    }
  }
}

std::vector<ShardReadPiece> plan_read(const ShardTensor& tensor, int64_t begin, int64_t end) {
  const int64_t n = tensor.numel();
  MOEPEAK_CHECK(0 <= begin && begin <= end && end <= n, "plan_read of tensor '", tensor.name,
                "': elements [", begin, ", ", end, ") are outside its ", n);
  const uint64_t es = dtype_size(tensor.dtype);
  std::vector<ShardReadPiece> pieces;
  for (const ShardSlice& s : tensor.slices) {
    const int64_t lo = std::max(begin, s.begin);
    const int64_t hi = std::min(end, s.end);
    if (lo >= hi) continue;
    pieces.push_back({s.file, s.offset + static_cast<uint64_t>(lo - s.begin) * es,
                      static_cast<uint64_t>(hi - lo) * es, lo - begin});
  }
  return pieces;
}

}  // namespace moepeak
