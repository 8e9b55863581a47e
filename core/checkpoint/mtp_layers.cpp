// MTP layers carried from the Hub checkpoint to the run's checkpoints and export (mtp_layers.h).
#include "core/checkpoint/mtp_layers.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/checkpoint/checksum.h"
#include "core/checkpoint/safetensors.h"
#include "core/error.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

// Reads the file at `path` front to back in pieces of `sizes`, calling f(piece index, bytes,
// size) for each; throws naming the file when it is shorter or cannot be read.
template <typename F>
void read_in_pieces(const std::string& path, const std::vector<uint64_t>& sizes, F&& f) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MOEPEAK_INPUT_ERROR(path, ": cannot open: ", std::strerror(errno));
  uint64_t largest = 0;
  for (uint64_t s : sizes) largest = std::max(largest, s);
  std::vector<char> buffer(static_cast<size_t>(largest));
  uint64_t offset = 0;
  try {
    for (size_t k = 0; k < sizes.size(); ++k) {
      size_t done = 0;
      while (done < sizes[k]) {
        const ssize_t n =
            ::pread(fd, buffer.data() + done, sizes[k] - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          MOEPEAK_INPUT_ERROR(path, ": cannot read bytes [", offset, ", ", offset + sizes[k], ")",
                              n < 0 ? ": " : " (the file is shorter)",
                              n < 0 ? std::strerror(errno) : "");
        }
        done += static_cast<size_t>(n);
      }
      f(k, buffer.data(), sizes[k]);
      offset += sizes[k];
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace

int64_t mtp_layer_of(std::string_view tensor, int64_t layers, int64_t mtp_layers) {
  constexpr std::string_view prefix = "model.layers.";
  if (mtp_layers <= 0 || !tensor.starts_with(prefix)) return -1;
  int64_t layer = 0;
  size_t at = prefix.size();
  const size_t digits = at;
  for (; at < tensor.size() && tensor[at] >= '0' && tensor[at] <= '9'; ++at) {
    if (layer > (int64_t{1} << 40)) return -1;
    layer = layer * 10 + (tensor[at] - '0');
  }
  if (at == digits || at >= tensor.size() || tensor[at] != '.') return -1;
  return layer >= layers && layer < layers + mtp_layers ? layer : -1;
}

std::vector<std::string> mtp_stored_names(const HfCheckpoint& hf, const ModelConfig& model) {
  std::vector<std::string> names;
  for (const std::string& name : hf.stored_names()) {
    if (mtp_layer_of(name, model.num_hidden_layers, model.num_nextn_predict_layers) >= 0) {
      names.push_back(name);
    }
  }
  return names;
}

ShardFileInfo checksum_file(const std::string& path, const std::string& name,
                            uint64_t block_bytes) {
  MOEPEAK_CHECK(block_bytes > 0, "checksum_file: blocks of 0 bytes");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) MOEPEAK_INPUT_ERROR(path, ": cannot read its size: ", ec.message());
  ShardFileInfo info{name, size, {}};
  std::vector<uint64_t> sizes;
  for (uint64_t at = 0; at < size; at += block_bytes)
    sizes.push_back(std::min(block_bytes, size - at));
  read_in_pieces(path, sizes, [&](size_t, const char* bytes, uint64_t n) {
    info.blocks.push_back({n, xxh3_64(bytes, static_cast<size_t>(n))});
  });
  return info;
}

void verify_carried_file(const std::string& dir, const ShardFileInfo& info) {
  const std::string path = (fs::path(dir) / info.name).string();
  if (!fs::exists(path)) {
    MOEPEAK_INPUT_ERROR("checkpoint ", dir, ": ", info.name,
                        ", a carried file its manifest.json lists, is missing");
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != info.bytes) {
    MOEPEAK_INPUT_ERROR(path, ": ", ec ? ec.message() : std::to_string(size) + " bytes",
                        "; the checkpoint's manifest.json says ", info.bytes);
  }
  std::vector<uint64_t> sizes;
  for (const ShardBlock& b : info.blocks) sizes.push_back(b.bytes);
  uint64_t offset = 0;
  read_in_pieces(path, sizes, [&](size_t k, const char* bytes, uint64_t n) {
    if (xxh3_64(bytes, static_cast<size_t>(n)) != info.blocks[k].xxh3) {
      MOEPEAK_INPUT_ERROR(path, ": bytes [", offset, ", ", offset + n,
                          ") do not match their checksum in the checkpoint's manifest.json (the "
                          "file is corrupt)");
    }
    offset += n;
  });
}

std::optional<CarriedFile> write_mtp_layers(const HfCheckpoint& hf, const ModelConfig& model,
                                            const std::string& path, uint64_t block_bytes,
                                            uint64_t buffer_bytes) {
  const std::vector<std::string> names = mtp_stored_names(hf, model);
  if (names.empty()) return std::nullopt;
  SafetensorsWriter writer;
  std::vector<char> buffer;  // grown to what the largest tensor needs, at most buffer_bytes
  const size_t chunk = static_cast<size_t>(std::max<uint64_t>(buffer_bytes, 4096));
  for (const std::string& name : names) {
    const SafetensorsFile& file = hf.stored_file(name);
    const SafetensorsTensorInfo& info = file.info(name);
    writer.add_streamed(name, info.dtype, info.shape,
                        [&file, &name, &buffer, chunk](FileSink& out) {
                          const size_t bytes = file.info(name).bytes;
                          buffer.resize(std::max(buffer.size(), std::min(bytes, chunk)));
                          for (size_t at = 0; at < bytes; at += chunk) {
                            const size_t n = std::min(chunk, bytes - at);
                            file.read_bytes(name, at, buffer.data(), n);
                            out.write(buffer.data(), n);
                          }
                        });
  }
  writer.set_metadata("format", "pt");
  writer.write(path);
  try {
    return CarriedFile{path, checksum_file(path, kMtpLayersFile, block_bytes)};
  } catch (...) {
    std::error_code ec;
    fs::remove(path, ec);
    throw;
  }
}

std::optional<CarriedFile> relink_mtp_layers(const std::string& dir, const std::string& folder) {
  if (!is_sharded_checkpoint(dir)) return std::nullopt;
  const ShardedCheckpoint checkpoint(dir);
  const std::vector<ShardFileInfo>& carried = checkpoint.manifest().carried;
  auto it = std::find_if(carried.begin(), carried.end(),
                         [](const ShardFileInfo& f) { return f.name == kMtpLayersFile; });
  if (it == carried.end()) return std::nullopt;
  const fs::path from = fs::path(dir) / it->name;
  std::error_code ec;
  const uint64_t size = fs::exists(from) ? fs::file_size(from, ec) : 0;
  if (!fs::exists(from) || ec || size != it->bytes) {
    MOEPEAK_INPUT_ERROR(
        from.string(), ": ", fs::exists(from) ? std::to_string(size) + " bytes" : "missing",
        "; the checkpoint's manifest.json lists it as a carried file of ", it->bytes, " bytes");
  }
  create_directories(folder);
  const fs::path to = fs::path(folder) / kMtpLayersFile;
  link_or_copy_file(from, to);
  return CarriedFile{to.string(), *it};
}

std::optional<CarriedFile> carry_mtp_layers(const HfCheckpoint& hf, const ModelConfig& model,
                                            const std::string& folder, const ZeroParamStore& params,
                                            Stream& stream) {
  // Every rank opened the same checkpoint: all skip the collective alike.
  if (mtp_stored_names(hf, model).empty()) return std::nullopt;
  const std::string path = (fs::path(folder) / kMtpLayersFile).string();
  std::optional<CarriedFile> carried;
  run_and_agree(params, stream, path, params.rank() == 0, [&] {
    create_directories(folder);
    carried = write_mtp_layers(hf, model, path);
  });
  return carried;
}

std::optional<CarriedFile> carry_mtp_layers_of_checkpoint(const std::string& dir,
                                                          const std::string& folder,
                                                          const ZeroParamStore& params,
                                                          Stream& stream) {
  std::optional<CarriedFile> carried;
  run_and_agree(params, stream, "the MTP layers of " + dir, params.rank() == 0,
                [&] { carried = relink_mtp_layers(dir, folder); });
  return carried;
}

}  // namespace moepeak
