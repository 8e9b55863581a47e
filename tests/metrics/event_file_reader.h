// The tests' own reader of TensorBoard events files, written apart from the library's
// (core/metrics/tensorboard_writer.cpp) so that a mistake in one is not repeated by the other:
// the record framing read byte by byte, both CRCs recomputed with a bit-at-a-time CRC32C (not the
// library's table). Each record is decoded by core/metrics/tensorboard_event.h into a view with
// the accessors of protoc's classes (tensorboard::Event below); that the bytes are protobuf's own
// for core/metrics/tensorboard_event.proto is checked against protoc itself
// (test_tensorboard_writer's ProtocReadsAndWritesTheSameBytes).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/metrics/tensorboard_event.h"

namespace moepeak::tensorboard {

// A decoded Event with the accessor names of protoc's generated classes.
class Event {
 public:
  struct Value {
    TensorBoardScalar scalar;
    const std::string& tag() const { return scalar.tag; }
    float simple_value() const { return static_cast<float>(scalar.value); }
    bool has_simple_value() const { return true; }  // encode_event always writes it
  };
  struct Summary {
    std::vector<Value> values;
    int value_size() const { return static_cast<int>(values.size()); }
    const Value& value(int i) const { return values.at(static_cast<size_t>(i)); }
    const std::vector<Value>& value() const { return values; }
  };
  bool ParseFromString(const std::string& bytes) {
    if (!try_decode_event(bytes, record_)) return false;
    summary_.values.clear();
    for (const TensorBoardScalar& s : record_.scalars) summary_.values.push_back(Value{s});
    return true;
  }
  const std::string& file_version() const { return record_.file_version; }
  int64_t step() const { return record_.step; }
  double wall_time() const { return record_.wall_time; }
  bool has_summary() const { return !record_.has_file_version; }
  const Summary& summary() const { return summary_; }

 private:
  EventRecord record_;
  Summary summary_;
};

}  // namespace moepeak::tensorboard

namespace moepeak::test_support {

// CRC32C one bit at a time (reflected polynomial 0x82F63B78).
inline uint32_t bitwise_crc32c(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t r = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) {
    r ^= p[i];
    for (int bit = 0; bit < 8; ++bit) r = (r >> 1) ^ (0x82F63B78u & (0u - (r & 1u)));
  }
  return ~r;
}

inline uint32_t bitwise_masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = bitwise_crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

inline uint64_t little_endian(const std::string& bytes, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes.at(at + i))) << (8 * i);
  return v;
}

// Every record of `path` as an Event; a framing or CRC mistake, a cut record at the end or bytes
// that do not parse are test failures.
inline std::vector<tensorboard::Event> read_event_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<tensorboard::Event> events;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 16) {
      ADD_FAILURE() << path << ": " << bytes.size() - at << " bytes left at byte " << at
                    << ", fewer than a record's frame";
      break;
    }
    const uint64_t length = little_endian(bytes, at, 8);
    EXPECT_EQ(little_endian(bytes, at + 8, 4), bitwise_masked_crc32c(bytes.data() + at, 8))
        << path << ": length CRC of the record at byte " << at;
    if (length > bytes.size() - at - 16) {
      ADD_FAILURE() << path << ": the record at byte " << at << " says " << length
                    << " bytes; the file ends first";
      break;
    }
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(little_endian(bytes, at + 12 + length, 4),
              bitwise_masked_crc32c(data.data(), data.size()))
        << path << ": data CRC of the record at byte " << at;
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromString(data)) << path << ": record at byte " << at;
    events.push_back(event);
    at += 16 + length;
  }
  return events;
}

// The events files of a directory, sorted by name (as TensorBoard reads them).
inline std::vector<std::filesystem::path> event_files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// step -> tag -> value over every file of `dir`. Each file must open with the file_version record
// "brain.Event:2" and every later record must be a step's summary; a step found twice (in one
// file or two) is a test failure.
using StepScalars = std::map<int64_t, std::map<std::string, float>>;
inline StepScalars scalars_in(const std::filesystem::path& dir) {
  StepScalars out;
  for (const std::filesystem::path& file : event_files_in(dir)) {
    const std::vector<tensorboard::Event> events = read_event_file(file);
    if (events.empty()) {
      ADD_FAILURE() << file << " holds no record";
      continue;
    }
    EXPECT_EQ(events[0].file_version(), "brain.Event:2") << file;
    for (size_t i = 1; i < events.size(); ++i) {
      const tensorboard::Event& e = events[i];
      EXPECT_TRUE(e.has_summary()) << file << " record " << i;
      if (out.count(e.step())) {
        ADD_FAILURE() << "step " << e.step() << " twice (again in " << file << ")";
        continue;
      }
      std::map<std::string, float>& tags = out[e.step()];
      for (const tensorboard::Event::Value& v : e.summary().value()) {
        EXPECT_TRUE(v.has_simple_value()) << v.tag();
        EXPECT_FALSE(tags.count(v.tag())) << v.tag() << " twice at step " << e.step();
        tags[v.tag()] = v.simple_value();
      }
    }
  }
  return out;
}

}  // namespace moepeak::test_support
