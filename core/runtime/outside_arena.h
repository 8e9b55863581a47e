// The device memory a CUDA rank holds outside its arena, term by term: the CUDA context, cuBLAS's
// workspaces and state, NCCL's communicator buffers (docs/plan.md#outside-the-arena). One function
// for both users: the plan prints these terms beside its live sets, and the CUDA backend keeps
// their sum free when it sizes an "auto" arena. On the CPU backend there is nothing outside the
// arena (the plan has no such terms).
//
//   OutsideArena o = cuda_outside_arena({.group_communicators = 3, .gemm_streams = 1});
//   o.total();  // 528 MiB + 40 MiB + 3 x 512 MiB
//
// Where the figures come from (an H200, CUDA 13.0, driver 580.159, lazy module loading, one rank;
// docs/perf.md "On an H200"): the driver reported 527 MiB in use when the backend opened the
// device and 567 MiB beside the arena after a training step of the small preset with every
// bounded schedule on — 40 MiB = one 32 MiB cuBLASLt workspace (the compute stream's; the other
// streams run no GEMM) and 8 MiB of cuBLAS/cuBLASLt handles and the grouped GEMM's pointer
// staging. NCCL's buffers are NOT measured (one GPU: no communicator of more than one rank): the
// per-communicator figure is an allowance — NCCL's default 4 MiB buffers for its three protocols
// per channel and peer, on the 16-32 channels of an NVLink node — to be replaced by a measurement
// on a node of several GPUs (the metrics' outside_arena_bytes gives it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moepeak {

inline constexpr uint64_t kCudaContextBytes = 528ull << 20;
inline constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;    // per stream that runs GEMMs
inline constexpr uint64_t kCublasStateBytes = 8ull << 20;         // handles, pointer staging
inline constexpr uint64_t kNcclCommunicatorBytes = 512ull << 20;  // allowance, not measured

struct OutsideArenaInputs {
  int group_communicators = 0;  // communicators of more than one rank (NCCL's, on CUDA)
  int gemm_streams = 1;         // streams that run cuBLAS GEMMs, each with its own workspace
};

struct OutsideArenaTerm {
  std::string name;  // "cuda_context", "cublas", "nccl_buffers"
  uint64_t bytes = 0;
  std::string basis;  // "measured: ..." or "allowance: ..."
};

struct OutsideArena {
  OutsideArenaInputs inputs;  // what the terms were computed for
  std::vector<OutsideArenaTerm> terms;
  uint64_t total() const;
};

OutsideArena cuda_outside_arena(const OutsideArenaInputs& in);

}  // namespace moepeak
