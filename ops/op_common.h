// Shared by every op header: which backend a tensor's op runs on. Each op declares
// `<op>_cpu(...)` and `<op>_cuda(...)` with one signature (stream last) and an inline `<op>(...)`
// that picks the entry point of the tensors' backend.
#pragma once

#include "core/error.h"
#include "core/runtime/tensor.h"

namespace moepeak::ops {

// True when the tensor is device memory of a CUDA backend.
bool runs_on_cuda(const Tensor& t);

// Throws: this build has no CUDA backend, so `op` cannot run on a CUDA tensor.
[[noreturn]] void throw_no_cuda(const char* op);

}  // namespace moepeak::ops
