// Tensor: a non-owning view — pointer, shape, dtype, and where the bytes live — plus
// OwnedTensor, a Buffer from the arena (or pinned pool) with its view. Ops take Tensors; schedules
// own OwnedTensors. Tensors are contiguous and row-major: shape (B, T, C) has stride (T*C, C, 1).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/runtime/buffer.h"
#include "core/runtime/dtype.h"

namespace moepeak {

class Backend;

// Where a tensor's bytes are: device memory of a backend (arena), or host memory (pinned pool or
// plain). On the CPU backend both are host addresses; the tag still says which pool they came from.
enum class Placement { device, host };

class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const;  // negative i counts from the end
  int64_t numel() const;
  // The same shape with dimension i set to `size`.
  Shape with_dim(int i, int64_t size) const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;            // "(4, 128, 64)"
  std::vector<int64_t> dims() const;  // {4, 128, 64}

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Placement placement, Backend* backend = nullptr);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    // NOTES: a typed view of another dtype is almost always a bug that corrupts memory silently.
    MOEPEAK_CHECK(dtype_of<T>::value == dtype_, "tensor of ", dtype_name(dtype_), " viewed as ",
                  dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data_);
  }
  const Shape& shape() const { return shape_; }
  int64_t size(int dim) const { return shape_[dim]; }
  int ndim() const { return shape_.ndim(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Placement placement() const { return placement_; }
  Backend* backend() const { return backend_; }
  bool defined() const { return data_ != nullptr; }

  // Same bytes, another shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) along dim 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // Throws naming `what` unless the shape and dtype are as expected.
  void expect(const Shape& shape, DType dtype, std::string_view what) const;
  std::string str() const;  // "f32(4, 128, 64)@device"

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Placement placement_ = Placement::device;
  Backend* backend_ = nullptr;
};

// A tensor that owns its bytes.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  // Device memory from the backend's arena.
  static OwnedTensor device(Backend& backend, Shape shape, DType dtype, LiveSet set,
                            std::string_view what);
  // Pinned host memory from the backend's pinned pool.
  static OwnedTensor pinned(Backend& backend, Shape shape, DType dtype, LiveSet set,
                            std::string_view what);

  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: an OwnedTensor is usable as a Tensor
  void* data() const { return view_.data(); }
  template <typename T>
  T* data_as() const {
    return view_.data_as<T>();
  }
  const Shape& shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  LiveSet live_set() const { return buffer_.live_set(); }
  void reset() {
    buffer_.reset();
    view_ = Tensor();
  }

 private:
  Buffer buffer_;
  Tensor view_;
};

}  // namespace moepeak
