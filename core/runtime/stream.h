// Streams and events with CUDA's semantics, implemented per backend.
//
// A Stream runs the work submitted to it in order. An Event marks a point in a stream:
// `event.record(s)` captures all work submitted to `s` so far; `t.wait(event)` makes work submitted
// to `t` afterwards wait until that captured work has finished (a later re-record does not change
// what an earlier wait waits for); `event.synchronize()` blocks the host until it has finished.
// Waiting on an event that was never recorded is a no-op, as in CUDA.
//
// On the CPU backend a stream is a worker thread with a queue, so pipelined schedules really
// overlap and a missing wait is a real race (docs/design.md#backends). On CUDA these wrap
// cudaStream_t and cudaEvent_t.
#pragma once

#include <memory>
#include <string>

namespace moepeak {

class Event;

// A stream's scheduling priority. On CUDA, `high` is the device's greatest stream priority: when
// SMs free up, its pending blocks start before a normal stream's. The comm streams ask for it so
// that NCCL's kernels are not queued behind every block of a long GEMM; a CPU stream ignores it.
enum class StreamPriority { normal, high };

class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& name() const = 0;
  // Work submitted after this call starts only after the event's latest record has completed.
  virtual void wait(const Event& event) = 0;
  // Blocks the host until all work submitted so far has finished. Rethrows the first error raised
  // by work on this stream (errors are sticky, like CUDA's).
  virtual void synchronize() = 0;
  // cudaStream_t on CUDA; nullptr on the CPU.
  virtual void* native_handle() const = 0;
};

// Whether an event can time work (elapsed_ms). Events only for ordering are made without: on
// CUDA they are then created with cudaEventDisableTiming, which records and waits cheaper.
enum class EventTiming { off, on };

class Event {
 public:
  virtual ~Event() = default;
  // Captures the work submitted to `stream` so far.
  virtual void record(Stream& stream) = 0;
  // Blocks the host until the captured work has finished (no-op if never recorded).
  virtual void synchronize() = 0;
  // True when the captured work has finished (or the event was never recorded).
  virtual bool query() = 0;
  // Milliseconds from `start` to this event; both must have been created with EventTiming::on,
  // recorded and completed (an Error otherwise, on every backend).
  virtual double elapsed_ms(const Event& start) const = 0;
};

}  // namespace moepeak
