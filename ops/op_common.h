// Shared by every op header: which backend a tensor's op runs on. Each op declares
// `<op>_cpu(...)` and `<op>_cuda(...)` with one signature (stream last) and an inline `<op>(...)`
// that picks the entry point of the tensors' backend.
//
// Conventions every op follows:
// - Ops are asynchronous: the CPU entry point checks its arguments on the caller's thread (so a
//   shape mistake throws at the call) and enqueues the loop on the stream's worker.
// - Ops never allocate memory that grows with the problem (tokens, sequence, vocabulary): such
//   workspaces are Tensor arguments the caller takes from the arena under a live set. Scratch of a
//   fixed size (a key block, a row of one head) may live on the stack or in a thread-local
//   vector, as a GPU kernel would keep it in shared memory.
// - Gradient outputs say whether they are written (`=`) or accumulated (`+=`) in the header.
#pragma once

#include "core/error.h"
#include "core/runtime/tensor.h"

namespace moepeak::ops {

// True when the tensor is device memory of a CUDA backend.
bool runs_on_cuda(const Tensor& t);

// Throws: this build has no CUDA backend, so `op` cannot run on a CUDA tensor.
[[noreturn]] void throw_no_cuda(const char* op);

// The body of an op's inline entry point: calls `op`_cuda(args...) when `probe` (the op's first
// output) is CUDA device memory, else `op`_cpu(args...). In a build without CUDA a CUDA tensor
// throws naming the op.
//   inline void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& h, Stream& s) {
//     MOEPEAK_OP_ON_BACKEND(swiglu_forward, h, a, b, h, s);
//   }
#ifdef MOEPEAK_WITH_CUDA
#define MOEPEAK_OP_ON_BACKEND(op, probe, ...) \
  (::moepeak::ops::runs_on_cuda(probe) ? op##_cuda(__VA_ARGS__) : op##_cpu(__VA_ARGS__))
#else
#define MOEPEAK_OP_ON_BACKEND(op, probe, ...) \
  (::moepeak::ops::runs_on_cuda(probe) ? ::moepeak::ops::throw_no_cuda(#op) : op##_cpu(__VA_ARGS__))
#endif

// CPU kernels are templated on the element type: f32 in training, f64 in tests that compare with
// a float64 reference. Calls f(float{}) or f(double{}) for the tensor's dtype.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    default:
      break;
  }
  MOEPEAK_THROW("op ", op, " on the CPU supports f32 and f64, got ", dtype_name(dtype));
}

}  // namespace moepeak::ops
