// The asynchronous checkpoint snapshot's bytes (contract in checkpoint_snapshot.h).
#include "core/model/checkpoint_snapshot.h"

#include "core/runtime/pinned_pool.h"

namespace moepeak {

std::vector<DType> checkpoint_flat_dtypes(DType working) {
  const DType state = working == DType::bf16 ? DType::f32 : working;
  std::vector<DType> dtypes = {working, state, state};
  if (working == DType::bf16) dtypes.push_back(state);
  return dtypes;
}

uint64_t checkpoint_snapshot_bytes(int64_t elements, const std::vector<DType>& dtypes) {
  uint64_t bytes = 0;
  for (DType d : dtypes) {
    bytes += PinnedPool::footprint(static_cast<uint64_t>(elements) * dtype_size(d));
  }
  return bytes;
}

}  // namespace moepeak
