// Hugging Face safetensors files: the writer for checkpoints and the validating reader.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header size
// N, N bytes of UTF-8 JSON, then the data. The JSON is an object mapping each tensor name to
// {"dtype": "F32"|"F64"|"BF16"|"F16"|"I32"|"I64"|"U8"|"F8_E4M3", "shape": [d0, ...],
// "data_offsets": [begin, end]} with offsets relative to the start of the data, plus an optional
// "__metadata__" object of string to string. F8_E4M3 (float8_e4m3fn codes, one byte each: FP8
// checkpoints, core/checkpoint/fp8.h) and U8 are read and written as bytes; nothing converts them.
// The writer pads the JSON with spaces to a multiple of 8 bytes so that the data starts 8-byte
// aligned, and lays tensors out back to back in insertion order.
//
//   SafetensorsWriter w;
//   w.add("model.norm.weight", DType::f32, {64}, norm.data(), norm.size() * 4);
//   w.set_metadata("format", "pt");
//   w.write("ckpt/model.safetensors");          // atomically (core/atomic_file.h)
//
//   SafetensorsFile f = SafetensorsFile::open("ckpt/model.safetensors");
//   f.info("model.norm.weight");                // {dtype "F32", shape {64}, bytes 256, ...}
//   f.read("model.norm.weight", dst, 256);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/atomic_file.h"
#include "core/runtime/dtype.h"

namespace moepeak {

// The safetensors spelling of a DType: f32 "F32", f64 "F64", bf16 "BF16", i32 "I32", i64 "I64".
std::string_view safetensors_dtype_name(DType dtype);
// The DType of a safetensors dtype string; nullopt for "U8", "F8_E4M3" and for names this build
// does not handle.
std::optional<DType> dtype_from_safetensors(std::string_view name);
// Bytes per element of a safetensors dtype this build handles (F32 F64 BF16 F16 I32 I64 U8
// F8_E4M3); 0 for any other name. (F16 has no DType: it is read by the Hugging Face import, which
// converts.)
size_t safetensors_element_size(std::string_view name);

// Converts `count` floating-point elements from safetensors dtype `from` to `to` (each of F32,
// BF16, F16): F16 and BF16 widen to F32 exactly; F32 (and F16) narrow to BF16 by round to nearest
// even, as torch's .to(torch.bfloat16); same dtype copies. Throws for any other pair (F16 is only
// read, never written).
void convert_float_elements(const void* src, std::string_view from, void* dst, std::string_view to,
                            size_t count);

struct SafetensorsTensorInfo {
  std::string dtype;           // "F32", "BF16", "U8", ...
  std::vector<int64_t> shape;  // {} = a scalar (one element)
  size_t bytes = 0;            // product(shape) * element size
  size_t file_offset = 0;      // where the data starts in the file

  int64_t elements() const;
};

class SafetensorsWriter {
 public:
  // Adds a tensor. The data is REFERENCED, not copied: `data` must stay valid and unchanged until
  // write() returns (checkpoints are large; copying would double host memory). Throws
  // moepeak::Error on a duplicate or empty name, "__metadata__", a negative dimension, or
  // bytes != product(shape) * element size.
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           const void* data, size_t bytes);
  // The same with the safetensors dtype spelled out; this is how "U8" and "F8_E4M3" tensors are
  // added.
  void add(const std::string& name, std::string_view dtype, const std::vector<int64_t>& shape,
           const void* data, size_t bytes);
  // A tensor whose bytes `produce` writes into the file when write() reaches it (tensor by
  // tensor, with whatever buffer it likes: an export streams a model larger than memory). It must
  // write exactly product(shape) * element size bytes; write() fails otherwise.
  void add_streamed(const std::string& name, std::string_view dtype,
                    const std::vector<int64_t>& shape, std::function<void(FileSink&)> produce);
  void set_metadata(const std::string& key, const std::string& value);

  // The header JSON exactly as write() puts it in the file, padding included.
  std::string header_json() const;
  // Writes the file atomically; throws moepeak::Error naming the path on failure, leaving any
  // existing file at `path` untouched.
  void write(const std::string& path) const;

  size_t tensor_count() const { return tensors_.size(); }
  size_t data_bytes() const { return data_bytes_; }

 private:
  // bytes of product(shape) elements of dtype; throws on a bad name, dtype or shape.
  size_t checked_bytes(const std::string& name, std::string_view dtype,
                       const std::vector<int64_t>& shape) const;
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    const void* data;                        // or null, and `produce` writes the bytes
    std::function<void(FileSink&)> produce;  // add_streamed
    size_t bytes;
    size_t begin;  // offset in the data section
  };
  std::vector<Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

// A safetensors file opened for reading. The header is parsed and checked at open; read() reads
// one tensor's bytes with pread. Move-only (it holds the open file).
class SafetensorsFile {
 public:
  // Throws moepeak::Error naming the file (and the tensor) when it is missing or unreadable, the
  // header size runs past the end of the file, the JSON is malformed, an entry lacks or
  // mistypes dtype/shape/data_offsets, a dtype is unknown, shape x element size != the byte
  // range, a range lies outside the data section, or two ranges overlap.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names in the order the header lists them.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  // Throws moepeak::Error naming the file when there is no such tensor.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  // Reads the tensor into dst; throws unless bytes == info(name).bytes, or on a read error.
  void read(const std::string& name, void* dst, size_t bytes) const;
  // Reads bytes [offset, offset + bytes) of the tensor's data (a rank's slice of it); throws
  // naming the file and tensor when the range is outside the tensor, or on a read error.
  void read_bytes(const std::string& name, size_t offset, void* dst, size_t bytes) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsTensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moepeak
