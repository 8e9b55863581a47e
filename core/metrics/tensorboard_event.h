// The protobuf wire form of core/metrics/tensorboard_event.proto's Event, written and read by
// hand: the few fields TensorBoard's scalars need.
//
//   EventRecord e{.wall_time = 1.7e9, .step = 5, .scalars = {{"train/loss", 2.4}}};
//   std::string bytes = encode_event(e);     // the canonical proto3 serialization
//   EventRecord back = decode_event(bytes);  // false from try_decode_event on malformed bytes
//
// Wire (proto3, each field a varint key (number << 3 | wire type) then its value):
//   Event   1 wall_time  double, fixed64          omitted when 0
//           2 step       int64, varint            omitted when 0
//           3 file_version  string, length       (oneof what: the first record)
//           5 summary    Summary, length          (oneof what: a step's record)
//   Summary 1 value      repeated Value, length
//   Value   1 tag        string, length           omitted when empty
//           2 simple_value  float, fixed32        always (a oneof member keeps its presence)
// Fields are written in number order, which is protobuf's own serialization order, so the bytes
// equal protoc's for the same message (test_tensorboard_writer compares them with
// `protoc --encode`). The decoder skips fields it does not know, as protobuf does.
//
// NOTES: by hand, not through libprotobuf: Debian's libsentencepiece carries its own protobuf
// 3.14 (its "builtin_pb"), and a process that also loads libprotobuf 3.21 aborts in
// SentencePiece's version check (`moepeak data prepare` did). The .proto stays the schema.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/metrics/tensorboard_writer.h"  // defines: TensorBoardScalar

namespace moepeak {

struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  bool has_file_version = false;  // the first record of a file: file_version, no summary
  std::string file_version;
  std::vector<TensorBoardScalar> scalars;  // the summary's values (float32 on the wire)
};

std::string encode_event(const EventRecord& event);
// False (and `out` unspecified) when `bytes` are not an Event of this form.
bool try_decode_event(std::string_view bytes, EventRecord& out);

}  // namespace moepeak
