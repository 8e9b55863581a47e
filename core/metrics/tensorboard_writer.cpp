// TensorBoard event files: the record framing, the reader the resume rule needs, the writer
// (tensorboard_writer.h).
#include "core/metrics/tensorboard_writer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/metrics/crc32c.h"
#include "core/metrics/tensorboard_event.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";
constexpr const char* kFileVersion = "brain.Event:2";
constexpr size_t kLengthBytes = 8, kCrcBytes = 4;

void put_le(std::string& out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

uint64_t get_le(const char* p, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i)
    value |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return value;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A record of `path` parsed as an Event; an input Error when its bytes are not one.
EventRecord parse_event(const std::string& path, const std::string& record, size_t index) {
  EventRecord event;
  if (!try_decode_event(record, event)) {
    MOEPEAK_INPUT_ERROR(path, ": record ", index,
                        " is not a TensorBoard Event although its CRCs match");
  }
  return event;
}

}  // namespace

std::string frame_tfrecord(std::string_view data) {
  std::string out;
  out.reserve(kLengthBytes + 2 * kCrcBytes + data.size());
  put_le(out, data.size(), kLengthBytes);
  put_le(out, masked_crc32c(out.data(), kLengthBytes), kCrcBytes);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), kCrcBytes);
  return out;
}

TfRecords read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MOEPEAK_INPUT_ERROR(path, ": cannot open the events file: ", std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) MOEPEAK_INPUT_ERROR(path, ": reading the events file failed");
  TfRecords out;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t left = bytes.size() - offset;
    const char* frame = bytes.data() + offset;
    if (left < kLengthBytes + kCrcBytes) break;  // a cut header
    const uint64_t length = get_le(frame, kLengthBytes);
    if (get_le(frame + kLengthBytes, kCrcBytes) != masked_crc32c(frame, kLengthBytes)) {
      MOEPEAK_INPUT_ERROR(path, ": the length of the record at byte ", offset,
                          " fails its CRC check: the file is damaged (move it out of its "
                          "directory to go on without it)");
    }
    const size_t body = left - kLengthBytes - kCrcBytes;
    if (length > body || body - length < kCrcBytes) break;  // cut data or data CRC
    const char* data = frame + kLengthBytes + kCrcBytes;
    if (get_le(data + length, kCrcBytes) != masked_crc32c(data, length)) {
      MOEPEAK_INPUT_ERROR(path, ": the data of the record at byte ", offset,
                          " fails its CRC check: the file is damaged (move it out of its "
                          "directory to go on without it)");
    }
    out.records.emplace_back(data, length);
    offset += kLengthBytes + kCrcBytes + length + kCrcBytes;
  }
  out.tail_bytes = bytes.size() - offset;
  out.truncated_tail = out.tail_bytes > 0;
  return out;
}

std::vector<std::string> tensorboard_event_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kEventFilePrefix, 0) == 0 && entry.is_regular_file())
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

int64_t drop_tensorboard_steps_from(const std::string& dir, int64_t first_step) {
  int64_t dropped = 0;
  for (const std::string& path : tensorboard_event_files(dir)) {
    const TfRecords file = read_tfrecords(path);
    std::string kept;
    int64_t kept_steps = 0, dropped_here = 0;
    for (size_t i = 0; i < file.records.size(); ++i) {
      const EventRecord event = parse_event(path, file.records[i], i);
      // The file_version record heads the file; every other one belongs to its step.
      const bool header = event.has_file_version;
      if (!header && event.step >= first_step) {
        ++dropped_here;
        continue;
      }
      kept_steps += header ? 0 : 1;
      kept += frame_tfrecord(file.records[i]);
    }
    if (dropped_here == 0 && !file.truncated_tail) continue;
    if (kept_steps == 0) {
      std::error_code ec;
      fs::remove(path, ec);
      if (ec) MOEPEAK_INPUT_ERROR(path, ": cannot remove the events file: ", ec.message());
    } else {
      write_file_atomically(path, kept);
    }
    spdlog::info("tensorboard: {}: dropped {} record(s) of steps >= {}{}{}", path, dropped_here,
                 first_step, file.truncated_tail ? " and a cut record at its end" : "",
                 kept_steps == 0 ? "; no step left, removed" : "");
    dropped += dropped_here;
  }
  return dropped;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step)
    : next_step_(first_step) {
  MOEPEAK_CHECK(first_step >= 1, "TensorBoardWriter: first_step ", first_step, " < 1");
  create_directories(dir);
  drop_tensorboard_steps_from(dir, first_step);
  const std::string base = (fs::path(dir) / std::string(kEventFilePrefix)).string() +
                           std::to_string(static_cast<long long>(std::time(nullptr))) + "." +
                           process_host();
  // NOTES: "x": created here or not at all, so two writers (a restart within the same second on
  // the same host) never share a file; the second takes the next free ".<n>".
  for (int n = 0; file_ == nullptr; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && (errno != EEXIST || n >= 1000)) {
      MOEPEAK_INPUT_ERROR(path_, ": cannot create the events file: ", std::strerror(errno));
    }
  }
  EventRecord event;
  event.wall_time = unix_seconds_now();
  event.has_file_version = true;
  event.file_version = kFileVersion;
  append(encode_event(event));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_step(int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  MOEPEAK_CHECK(step >= next_step_, "TensorBoardWriter: step ", step, " after the steps before ",
                next_step_, " (steps must increase)");
  next_step_ = step + 1;
  EventRecord event;
  event.wall_time = unix_seconds_now();
  event.step = step;
  event.scalars = scalars;
  append(encode_event(event));
}

void TensorBoardWriter::append(const std::string& event_bytes) {
  const std::string record = frame_tfrecord(event_bytes);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    MOEPEAK_THROW("writing the events file ", path_, " failed: ", std::strerror(errno));
  }
}

}  // namespace moepeak
