// TensorBoard event files (metrics.tensorboard = true): the scalars of each training step,
// written by rank 0 into <run directory>/tensorboard/, which `tensorboard --logdir` reads.
//
//   TensorBoardWriter tb(run_dir + "/tensorboard", /*first_step=*/101);  // a run resumed at 100
//   tb.write_step(101, {{"train/loss", 2.45}, {"train/lr", 3e-3}});       // one record, flushed
//
// The file (TensorFlow's record format, which TensorBoard reads): a sequence of records,
//   uint64 length (little-endian) | uint32 masked_crc32c(those 8 bytes)
//   | data: `length` bytes, one serialized Event (core/metrics/tensorboard_event.proto)
//   | uint32 masked_crc32c(data)                      (the CRCs little-endian too; crc32c.h)
// Its first record is Event{wall_time, file_version: "brain.Event:2"}; every later one is
// Event{wall_time, step, summary: one Value{tag, simple_value} per scalar}: one record per step.
// The values are stored as float32 (simple_value), the record's wall_time as seconds since the
// Unix epoch. A file is named events.out.tfevents.<unix seconds>.<host> (".<n>" appended when a
// file of that name exists), and each run of the trainer opens a new one.
//
// NOTES: no step appears twice in the directory. A run that starts at step s (1, or a
// checkpoint's step + 1 on a resume) first drops, from every events file already in the
// directory, the records of steps >= s: the steps an earlier run wrote after the checkpoint it
// is resumed from (or all of them when it starts over at step 1), which this run writes again.
// Each file that loses records is rewritten atomically (core/atomic_file.h), or removed when no
// step record is left in it, so a crash during the rewrite leaves the old or the new file and the
// next start repeats the rule. A record cut short at a file's end (a crash mid-write) is dropped
// in the same rewrite; a record whose CRC does not match is an Error naming the file and offset
// (the file is damaged: nothing is rewritten, no new file is opened).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace moepeak {

// One value of a step under its TensorBoard tag ("train/loss"); written as float32.
struct TensorBoardScalar {
  std::string tag;
  double value = 0;
};

// The record format's frame around `data` (the layout above): 8 + 4 + data.size() + 4 bytes.
std::string frame_tfrecord(std::string_view data);

// The payloads of a record file's frames, in order, each checked against both its CRCs.
// truncated_tail: the file ends inside a frame (its last `tail_bytes` bytes are not a whole
// record), as a crash mid-write leaves it. moepeak::Error when a CRC does not match.
struct TfRecords {
  std::vector<std::string> records;
  bool truncated_tail = false;
  size_t tail_bytes = 0;
};
TfRecords read_tfrecords(const std::string& path);

// The events files of `dir` (names starting "events.out.tfevents."), sorted by name; none when
// `dir` does not exist.
std::vector<std::string> tensorboard_event_files(const std::string& dir);

// The resume rule above on its own: drops every step record of step >= first_step from the
// events files of `dir`. Returns how many records it dropped.
int64_t drop_tensorboard_steps_from(const std::string& dir, int64_t first_step);

class TensorBoardWriter {
 public:
  // Creates `dir` when missing, applies the resume rule for `first_step` (>= 1), then opens a new
  // events file there and writes its first record. moepeak::Error on a file-system failure.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one record holding `scalars` at `step` and flushes it (a killed run loses at most the
  // step being written). Steps must be >= first_step and increase from call to call.
  void write_step(int64_t step, const std::vector<TensorBoardScalar>& scalars);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t next_step_;  // the smallest step write_step accepts
};

}  // namespace moepeak
