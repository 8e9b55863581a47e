// TensorBoard events files (core/metrics/tensorboard_writer.h) without a training run: CRC32C
// against the published vectors and a bit-at-a-time CRC, the record frame byte by byte, a
// writer's records read back by the tests' own reader (each one on disk as soon as it is
// written), and the resume rule: records of steps >= the new run's first step dropped from the
// files already there (rewritten, or removed when no step is left), a record cut at a file's end
// dropped, a record with a bad CRC an Error that changes nothing.
// Run: ctest -R test_tensorboard_writer
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/metrics/crc32c.h"
#include "core/metrics/tensorboard_event.h"
#include "core/metrics/tensorboard_writer.h"
#include "tests/expect_contains.h"
#include "tests/metrics/event_file_reader.h"
#include "tests/source_dir.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;
using namespace std::string_literals;

using test_support::bitwise_crc32c;
using test_support::bitwise_masked_crc32c;
using test_support::error_of;
using test_support::event_files_in;
using test_support::read_event_file;
using test_support::scalars_in;
using test_support::StepScalars;
using test_support::TempDir;

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The scalars run `run` writes at `step`: values off 0 and 1 that change with the step and the
// run (so a stale record of an earlier run shows), none a float exactly (the float32 conversion
// shows).
std::vector<TensorBoardScalar> scalars_of(int64_t step, int run) {
  const double s = static_cast<double>(step) + 0.37 * run;
  return {{"train/loss", 3.7 - 0.1 * s},
          {"perf/tokens_per_s", 12345.678 * s},
          {"memory/total_peak_bytes", 3.3e9 + 1000 * s}};
}

// Run `run` writes steps [from, to] through one writer opened with first_step `from`; returns
// its file.
fs::path write_steps(const fs::path& dir, int64_t from, int64_t to, int run) {
  TensorBoardWriter writer(dir.string(), from);
  for (int64_t step = from; step <= to; ++step) writer.write_step(step, scalars_of(step, run));
  return writer.path();
}

// Each step of `want` once, with the values its run wrote, and no other step.
void expect_steps(const StepScalars& got, const std::map<int64_t, int>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, run] : want) {
    ASSERT_TRUE(got.count(step)) << "step " << step;
    const std::vector<TensorBoardScalar> values = scalars_of(step, run);
    ASSERT_EQ(got.at(step).size(), values.size()) << "step " << step;
    for (const TensorBoardScalar& s : values) {
      EXPECT_EQ(got.at(step).at(s.tag), static_cast<float>(s.value))
          << s.tag << " at step " << step << " (run " << run << ")";
    }
  }
}

// {first: run, ..., last: run}
std::map<int64_t, int> steps_of(int run, int64_t first, int64_t last,
                                std::map<int64_t, int> before = {}) {
  for (int64_t step = first; step <= last; ++step) before[step] = run;
  return before;
}

TEST(Crc32c, PublishedVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of ones, ascending and descending.
  std::vector<uint8_t> bytes(32, 0);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x8A9136AAu);
  std::fill(bytes.begin(), bytes.end(), 0xFF);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x62A8AB43u);
  for (size_t i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x46DD794Eu);
  for (size_t i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(masked_crc32c(nullptr, 0), 0xa282ead8u) << "the mask of 0 is the added constant";
  EXPECT_EQ(mask_crc32c(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

TEST(Crc32c, TableEqualsBitwiseAndExtends) {
  std::mt19937 rng(7);
  for (size_t n : {1u, 3u, 8u, 63u, 64u, 1000u}) {
    std::vector<uint8_t> data(n);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(crc32c(data.data(), n), bitwise_crc32c(data.data(), n)) << n;
    EXPECT_EQ(masked_crc32c(data.data(), n), bitwise_masked_crc32c(data.data(), n)) << n;
    const size_t cut = n / 3;
    EXPECT_EQ(crc32c_extend(crc32c(data.data(), cut), data.data() + cut, n - cut),
              crc32c(data.data(), n))
        << n;
  }
}

TEST(TfRecord, FrameIsLengthCrcDataCrc) {
  const std::string data = "a record\0with a zero"s;
  const std::string frame = frame_tfrecord(data);
  ASSERT_EQ(frame.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(test_support::little_endian(frame, 0, 8), data.size());
  EXPECT_EQ(test_support::little_endian(frame, 8, 4), bitwise_masked_crc32c(frame.data(), 8));
  EXPECT_EQ(frame.substr(12, data.size()), data);
  EXPECT_EQ(test_support::little_endian(frame, 12 + data.size(), 4),
            bitwise_masked_crc32c(data.data(), data.size()));
  EXPECT_EQ(frame_tfrecord("").size(), 16u) << "an empty record is a frame alone";
}

TEST(TensorBoardWriter, RecordsReadBackWithTheirValuesAsFloats) {
  TempDir dir;
  const fs::path tb = dir.path() / "run" / "tensorboard";  // created with its parents
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  TensorBoardWriter writer(tb.string(), 1);
  const fs::path file = writer.path();
  EXPECT_EQ(file.parent_path(), tb);
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
  EXPECT_CONTAINS(file.filename().string(), "." + process_host());
  writer.write_step(1, scalars_of(1, 0));
  const std::vector<TensorBoardScalar> odd = {
      {"train/loss", std::numeric_limits<double>::quiet_NaN()},  // a skipped step's loss
      {"train/lr", 3e-4},
      {"perf/mfu", 0.2137},
      {"memory/weights_peak_bytes", 123456789.0}};  // not a float: rounds
  writer.write_step(3, odd);                        // a step may be missing (none is written twice)
  // Each record is on disk (flushed) before the writer closes.
  const std::vector<tensorboard::Event> events = read_event_file(file);
  const double after =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[0].step(), 0);
  EXPECT_FALSE(events[0].has_summary());
  for (const tensorboard::Event& e : events) {
    EXPECT_GE(e.wall_time(), before - 1);  // the clock read as seconds since the epoch
    EXPECT_LE(e.wall_time(), after + 1);
  }
  EXPECT_EQ(events[1].step(), 1);
  ASSERT_EQ(events[1].summary().value_size(), 3);
  const std::vector<TensorBoardScalar> first = scalars_of(1, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[1].summary().value(i).tag(), first[i].tag) << "in the given order";
    EXPECT_EQ(events[1].summary().value(i).simple_value(), static_cast<float>(first[i].value));
  }
  EXPECT_EQ(events[2].step(), 3);
  ASSERT_EQ(events[2].summary().value_size(), 4);
  EXPECT_TRUE(std::isnan(events[2].summary().value(0).simple_value()));
  for (int i = 1; i < 4; ++i)
    EXPECT_EQ(events[2].summary().value(i).simple_value(), static_cast<float>(odd[i].value));
  EXPECT_EQ(events[2].summary().value(3).simple_value(), 123456792.0f) << "float32's 24 bits";

  EXPECT_THROW(writer.write_step(3, odd), Error) << "a step twice";
  EXPECT_THROW(writer.write_step(2, odd), Error) << "a step back";
  EXPECT_THROW(TensorBoardWriter(tb.string(), 0), Error) << "steps start at 1";
}

// Each writer opens a file of its own: where the name of this second is taken, the next free
// ".<n>" (names taken for the next seconds too, so the test does not depend on the clock).
TEST(TensorBoardWriter, EachWriterOpensItsOwnFile) {
  TempDir dir;
  const long long now = static_cast<long long>(std::time(nullptr));
  std::vector<fs::path> taken;
  for (long long t = now; t <= now + 3; ++t) {
    taken.push_back(dir.path() /
                    ("events.out.tfevents." + std::to_string(t) + "." + process_host()));
    write_bytes(taken.back(), "");  // an empty events file: no record, nothing dropped
  }
  const fs::path a = write_steps(dir.path(), 1, 2, 0);
  const fs::path b = write_steps(dir.path(), 3, 4, 0);
  EXPECT_EQ(a.extension(), ".1") << a;
  EXPECT_NE(a, b);
  for (const fs::path& t : taken) {
    EXPECT_EQ(fs::file_size(t), 0u) << t;
    fs::remove(t);
  }
  EXPECT_EQ(event_files_in(dir.path()).size(), 2u);
  expect_steps(scalars_in(dir.path()), steps_of(0, 1, 4));
}

// Run 0 wrote steps 1..6; run 1 resumes from the checkpoint of step 3: run 0's file keeps 1..3
// (rewritten), run 1's holds 4..8, each step once with the values of the run that wrote it last.
TEST(TensorBoardResume, DropsTheStepsTheResumedRunWritesAgain) {
  TempDir dir;
  const fs::path old_file = write_steps(dir.path(), 1, 6, 0);
  const fs::path other = dir.path() / "notes.txt";  // not an events file: left alone
  write_bytes(other, "keep me");
  const std::string old_bytes = file_bytes(old_file);
  EXPECT_EQ(drop_tensorboard_steps_from(dir.path().string(), 7), 0) << "nothing at 7 or later";
  EXPECT_EQ(file_bytes(old_file), old_bytes) << "not rewritten when nothing is dropped";

  const fs::path new_file = write_steps(dir.path(), 4, 8, 1);
  const std::vector<tensorboard::Event> kept = read_event_file(old_file);
  ASSERT_EQ(kept.size(), 4u) << "its header and steps 1..3";
  EXPECT_EQ(kept[0].file_version(), "brain.Event:2");
  for (int64_t step = 1; step <= 3; ++step) EXPECT_EQ(kept[step].step(), step);
  EXPECT_EQ(file_bytes(old_file), old_bytes.substr(0, file_bytes(old_file).size()))
      << "the records kept are the bytes they were";
  expect_steps(scalars_in(dir.path()), steps_of(1, 4, 8, steps_of(0, 1, 3)));
  EXPECT_EQ(file_bytes(other), "keep me");
  EXPECT_EQ(event_files_in(dir.path()).size(), 2u);

  // Run 2 from step 1's checkpoint: run 0's file keeps step 1, run 1's loses every step and goes.
  EXPECT_EQ(drop_tensorboard_steps_from(dir.path().string(), 2), 2 + 5);
  EXPECT_FALSE(fs::exists(new_file)) << "no step left in it";
  write_steps(dir.path(), 2, 3, 2);
  expect_steps(scalars_in(dir.path()), steps_of(2, 2, 3, steps_of(0, 1, 1)));
  // Run 3 starts over at step 1: it replaces them all.
  const fs::path fresh = write_steps(dir.path(), 1, 2, 3);
  ASSERT_EQ(event_files_in(dir.path()), std::vector<fs::path>{fresh});
  expect_steps(scalars_in(dir.path()), steps_of(3, 1, 2));
}

TEST(TensorBoardResume, DropsARecordCutAtTheEnd) {
  TempDir dir;
  const fs::path file = write_steps(dir.path(), 1, 3, 0);
  const std::string whole = file_bytes(file);
  write_bytes(file, whole.substr(0, whole.size() - 5));  // a crash inside step 3's record
  const TfRecords cut = read_tfrecords(file.string());
  EXPECT_EQ(cut.records.size(), 3u) << "the header and steps 1, 2";
  EXPECT_TRUE(cut.truncated_tail);
  EXPECT_GT(cut.tail_bytes, 16u);
  // Resumed after step 5's checkpoint: the cut record goes, steps 1 and 2 stay.
  write_steps(dir.path(), 6, 6, 1);
  expect_steps(scalars_in(dir.path()), steps_of(1, 6, 6, steps_of(0, 1, 2)));
  EXPECT_FALSE(read_tfrecords(file.string()).truncated_tail);
  // A cut inside the first frame's header: no whole record, so the file goes.
  TempDir other;
  const fs::path short_file = write_steps(other.path(), 1, 1, 0);
  write_bytes(short_file, file_bytes(short_file).substr(0, 7));
  EXPECT_EQ(read_tfrecords(short_file.string()).tail_bytes, 7u);
  const fs::path again = write_steps(other.path(), 1, 1, 1);  // may reuse the name: same second
  EXPECT_EQ(event_files_in(other.path()), std::vector<fs::path>{again}) << "the cut file is gone";
  expect_steps(scalars_in(other.path()), steps_of(1, 1, 1));
}

TEST(TensorBoardResume, ABadCrcIsAnErrorThatChangesNothing) {
  TempDir dir;
  const fs::path file = write_steps(dir.path(), 1, 3, 0);
  const std::string whole = file_bytes(file);
  for (size_t flip : {size_t{2}, whole.size() - 20}) {  // a length byte, a data byte of step 3
    SCOPED_TRACE(flip);
    std::string damaged = whole;
    damaged[flip] = static_cast<char>(damaged[flip] ^ 0x10);
    write_bytes(file, damaged);
    const std::string message = error_of([&] { write_steps(dir.path(), 2, 2, 1); });
    EXPECT_CONTAINS(message, file.string());
    EXPECT_CONTAINS(message, "fails its CRC check");
    EXPECT_EQ(file_bytes(file), damaged) << "not rewritten";
    EXPECT_EQ(event_files_in(dir.path()).size(), 1u) << "no new file";
  }
}

// Debian's protoc on core/metrics/tensorboard_event.proto: encode_event's bytes are the ones
// `protoc --encode` writes for the same message (protobuf's canonical serialization), for a step's
// record (a zero value kept: a oneof member) and a file's first record; `protoc --decode` reads
// them back; and try_decode_event reads protoc's bytes.
std::string protoc(const std::string& mode, const fs::path& in, const fs::path& out) {
  const std::string cmd =
      "protoc --" + mode + "=moepeak.tensorboard.Event -I '" + test_support::source_dir() +
      "' core/metrics/tensorboard_event.proto < '" + in.string() + "' > '" + out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return file_bytes(out);
}

TEST(TensorBoardEvent, ProtocReadsAndWritesTheSameBytes) {
  test_support::TempDir dir;
  EventRecord step;
  step.wall_time = 1765000000.25;
  step.step = 42;
  step.scalars = {{"train/loss", 2.5}, {"perf/mfu", 0.0}, {"memory/weights_peak_bytes", 4096.0}};
  const std::string step_text =
      "wall_time: 1765000000.25 step: 42 summary { value { tag: \"train/loss\" simple_value: 2.5 }"
      " value { tag: \"perf/mfu\" simple_value: 0 }"
      " value { tag: \"memory/weights_peak_bytes\" simple_value: 4096 } }";
  EventRecord header;
  header.wall_time = 1765000000.5;
  header.has_file_version = true;
  header.file_version = "brain.Event:2";
  const std::string header_text = "wall_time: 1765000000.5 file_version: \"brain.Event:2\"";
  for (const auto& [event, text] : {std::pair{step, step_text}, std::pair{header, header_text}}) {
    write_bytes(dir.path() / "event.txt", text);
    const std::string theirs =
        protoc("encode", dir.path() / "event.txt", dir.path() / "theirs.bin");
    EXPECT_EQ(encode_event(event), theirs) << text;
    EventRecord back;
    ASSERT_TRUE(try_decode_event(theirs, back));
    EXPECT_EQ(back.step, event.step);
    EXPECT_EQ(back.wall_time, event.wall_time);
    EXPECT_EQ(back.file_version, event.file_version);
    ASSERT_EQ(back.scalars.size(), event.scalars.size());
    for (size_t i = 0; i < back.scalars.size(); ++i) {
      EXPECT_EQ(back.scalars[i].tag, event.scalars[i].tag);
      EXPECT_EQ(back.scalars[i].value, event.scalars[i].value);
    }
    write_bytes(dir.path() / "ours.bin", encode_event(event));
    const std::string decoded = protoc("decode", dir.path() / "ours.bin", dir.path() / "ours.txt");
    EXPECT_CONTAINS(decoded, event.has_file_version ? "file_version: \"brain.Event:2\""
                                                    : "tag: \"memory/weights_peak_bytes\"");
  }
  EventRecord junk;
  EXPECT_FALSE(
      try_decode_event("\x0a\x05"
                       "ab",
                       junk))
      << "a length past the end";
}

}  // namespace
}  // namespace moepeak
