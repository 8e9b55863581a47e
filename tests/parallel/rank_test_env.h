// RankTestEnv: what the multi-rank schedule tests (test_expert_parallel, test_llep,
// test_ring_dtp) share on each rank process — a CPU backend with a small arena (16 MiB, one
// worker thread), the communicator of the launched ranks, and inputs, poisoned outputs and
// read-backs in the run's dtype (f32, bf16 or f64), all in the arena's `workspace` set so the live
// set under test holds only its schedule's buffers.
//
// Each test derives its Env from it and adds what only it needs (index and label tensors of its
// own width, its collectives).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/fill.h"

namespace moepeak::test_support {

class RankTestEnv {
 public:
  explicit RankTestEnv(DType dtype) : dtype_(dtype) {
    BackendOptions options;
    options.device_memory = 16ull << 20;
    options.cpu_threads = 1;
    backend_ = Backend::create(options);
    comm_ = make_comm(*backend_, init_process_group());
  }
  Backend& backend() { return *backend_; }
  Stream& stream() { return backend_->default_stream(); }
  Comm& comm() { return *comm_; }
  DType dtype() const { return dtype_; }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }

  // Rows [begin, end) of a row-major (rows, width) array as a tensor of the run's dtype (or of
  // `as`: an fp32 gradient beside bf16), rounded to it once; written before the call returns.
  OwnedTensor input(const std::vector<double>& v, int64_t width, int64_t begin, int64_t end,
                    std::optional<DType> as = std::nullopt) {
    auto t = OwnedTensor::device(*backend_, Shape{end - begin, width}, as.value_or(dtype_),
                                 LiveSet::workspace, "test tensor");
    const auto first = v.begin() + begin * width;
    copy_from_host_as(std::vector<double>(first, first + (end - begin) * width), t, *backend_,
                      stream());
    stream().synchronize();
    return t;
  }
  // Rows [begin, end) of a row-major (rows, width) array of indices as an i32 tensor.
  OwnedTensor indices(const std::vector<int64_t>& v, int64_t width, int64_t begin, int64_t end) {
    auto t = OwnedTensor::device(*backend_, Shape{end - begin, width}, DType::i32,
                                 LiveSet::workspace, "test index");
    for (int64_t i = 0; i < (end - begin) * width; ++i) {
      t.data_as<int32_t>()[i] = static_cast<int32_t>(v[static_cast<size_t>(begin * width + i)]);
    }
    return t;
  }
  // An output of the run's dtype poisoned with NaN (on the stream).
  OwnedTensor nan_output(Shape shape) {
    auto t = OwnedTensor::device(*backend_, shape, dtype_, LiveSet::workspace, "test output");
    ops::fill(t, std::numeric_limits<double>::quiet_NaN(), stream());
    return t;
  }
  // Waits for the stream's work, then the tensor's values as doubles.
  std::vector<double> read(const Tensor& t) {
    return copy_to_host_as_double(t, *backend_, stream());
  }
  // Fills every free byte of the arena with NaN, so a schedule buffer read before it is written
  // poisons the results.
  void poison_free_arena() {
    std::vector<OwnedTensor> blocks;
    for (uint64_t free = backend_->arena().largest_free_block(); free >= 1024;
         free = backend_->arena().largest_free_block()) {
      blocks.push_back(OwnedTensor::device(*backend_, Shape{static_cast<int64_t>(free / 8)},
                                           DType::f64, LiveSet::workspace, "poison"));
      ops::fill(blocks.back(), std::numeric_limits<double>::quiet_NaN(), stream());
    }
    stream().synchronize();
  }

 private:
  DType dtype_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Comm> comm_;
};

}  // namespace moepeak::test_support
