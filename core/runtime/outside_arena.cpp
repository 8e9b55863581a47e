// The device memory outside the CUDA arena (see outside_arena.h).
#include "core/runtime/outside_arena.h"

#include "core/error.h"

namespace moepeak {

uint64_t OutsideArena::total() const {
  uint64_t sum = 0;
  for (const OutsideArenaTerm& t : terms) sum += t.bytes;
  return sum;
}

OutsideArena cuda_outside_arena(const OutsideArenaInputs& in) {
  MOEPEAK_CHECK(in.group_communicators >= 0 && in.gemm_streams >= 1,
                "outside the arena: ", in.group_communicators, " communicators, ", in.gemm_streams,
                " GEMM streams");
  OutsideArena o;
  o.inputs = in;
  o.terms.push_back(
      {"cuda_context", kCudaContextBytes, "measured: 527 MiB at device open, H200, CUDA 13.0"});
  o.terms.push_back(
      {"cublas", static_cast<uint64_t>(in.gemm_streams) * kCublasWorkspaceBytes + kCublasStateBytes,
       "measured: " + std::to_string(in.gemm_streams) +
           " x 32 MiB workspace + 8 MiB handles and staging"});
  o.terms.push_back({"nccl_buffers",
                     static_cast<uint64_t>(in.group_communicators) * kNcclCommunicatorBytes,
                     "allowance: " + std::to_string(in.group_communicators) +
                         " communicators x 512 MiB, not measured"});
  return o;
}

}  // namespace moepeak
