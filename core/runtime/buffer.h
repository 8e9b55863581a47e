// Buffer: an owning handle to bytes taken from the device arena or the pinned host pool, tagged
// with its live set. Move-only; the bytes go back to their owner when the Buffer dies.
//
// NOTES: releasing is immediate on the host, as in PyTorch's caching allocator. That is safe
// when every use of the bytes — the queued work of the old owner and the work of whoever gets them
// next — runs on one stream: stream order puts the new owner's work after the old owner's. When
// another stream still uses a buffer, release it only after an event shows that use finished.
#pragma once

#include <cstddef>
#include <utility>

#include "core/runtime/live_set.h"

namespace moepeak {

class BufferOwner {
 public:
  virtual ~BufferOwner() = default;
  virtual void release(void* ptr, size_t bytes, LiveSet set) noexcept = 0;
};

class Buffer {
 public:
  Buffer() = default;
  Buffer(BufferOwner* owner, void* ptr, size_t bytes, LiveSet set)
      : owner_(owner), ptr_(ptr), bytes_(bytes), set_(set) {}
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      set_ = o.set_;
    }
    return *this;
  }

  void reset() noexcept {
    if (owner_ != nullptr) owner_->release(ptr_, bytes_, set_);
    owner_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  LiveSet live_set() const { return set_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  BufferOwner* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  LiveSet set_ = LiveSet::workspace;
};

}  // namespace moepeak
