#include "core/runtime/tensor.h"

#include "core/runtime/backend.h"

namespace moepeak {

Shape::Shape(std::initializer_list<int64_t> dims) {
  MOEPEAK_CHECK(dims.size() <= kMaxDims, "shape with ", dims.size(), " dims; at most ", kMaxDims);
  for (int64_t d : dims) {
    MOEPEAK_CHECK(d >= 0, "negative dimension ", d);
    dims_[ndim_++] = d;
  }
}

int64_t Shape::operator[](int i) const {
  int j = i < 0 ? ndim_ + i : i;
  MOEPEAK_CHECK(j >= 0 && j < ndim_, "dim ", i, " out of range for shape ", str());
  return dims_[j];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

Shape Shape::with_dim(int i, int64_t size) const {
  int j = i < 0 ? ndim_ + i : i;
  MOEPEAK_CHECK(j >= 0 && j < ndim_ && size >= 0, "with_dim(", i, ", ", size, ") on ", str());
  Shape s = *this;
  s.dims_[j] = size;
  return s;
}

std::vector<int64_t> Shape::dims() const { return {dims_.begin(), dims_.begin() + ndim_}; }

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i) {
    if (dims_[i] != o.dims_[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < ndim_; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

Tensor::Tensor(void* data, Shape shape, DType dtype, Placement placement, Backend* backend)
    : data_(data), shape_(shape), dtype_(dtype), placement_(placement), backend_(backend) {}

Tensor Tensor::reshape(Shape shape) const {
  MOEPEAK_CHECK(shape.numel() == numel(), "cannot reshape ", shape_.str(), " to ", shape.str());
  return Tensor(data_, shape, dtype_, placement_, backend_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MOEPEAK_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [", begin,
                ", ", end, ") out of range for shape ", shape_.str());
  int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Shape out = shape_.with_dim(0, end - begin);
  char* p = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return Tensor(p, out, dtype_, placement_, backend_);
}

void Tensor::expect(const Shape& shape, DType dtype, std::string_view what) const {
  if (shape != shape_ || dtype != dtype_) {
    MOEPEAK_THROW(what, ": expected ", dtype_name(dtype), shape.str(), ", got ", str());
  }
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_.str() +
         (placement_ == Placement::device ? "@device" : "@host");
}

OwnedTensor OwnedTensor::device(Backend& backend, Shape shape, DType dtype, LiveSet set,
                                std::string_view what) {
  OwnedTensor t;
  t.buffer_ = backend.alloc(static_cast<size_t>(shape.numel()) * dtype_size(dtype), set, what);
  t.view_ = Tensor(t.buffer_.data(), shape, dtype, Placement::device, &backend);
  return t;
}

OwnedTensor OwnedTensor::pinned(Backend& backend, Shape shape, DType dtype, LiveSet set,
                                std::string_view what) {
  OwnedTensor t;
  t.buffer_ =
      backend.pinned().alloc(static_cast<size_t>(shape.numel()) * dtype_size(dtype), set, what);
  t.view_ = Tensor(t.buffer_.data(), shape, dtype, Placement::host, &backend);
  return t;
}

}  // namespace moepeak
