#include "ops/op_common.h"

#include "core/runtime/backend.h"

namespace moepeak::ops {

bool runs_on_cuda(const Tensor& t) {
  return t.backend() != nullptr && t.backend()->kind() == BackendKind::cuda &&
         t.placement() == Placement::device;
}

void throw_no_cuda(const char* op) {
  MOEPEAK_THROW("op ", op, " was given CUDA tensors but this build has no CUDA backend");
}

}  // namespace moepeak::ops
