// Device helpers of CUDA attention's document masks (AttentionVariant::doc_start, ops/attention.h),
// shared by the SIMT (ops/cuda/attention.cu) and tensor-core (attention_tc.cu) kernels.
//
//   doc_start: (B, T) i32; query t of sequence b sees keys s with doc_start[b][t] <= s <= t
//
// The contract (0 <= doc_start[b][t] <= t, non-decreasing in t) is the caller's and is not
// tested on the device; these helpers keep every index they produce inside [0, T] whatever the
// values, so a broken doc_start gives wrong numbers but no read outside the tensors.
#pragma once

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops::cuda {

// The first key position `pos` (< T) of sequence b may see by its document: doc_start[b][pos],
// raised to 0.
__device__ __forceinline__ int64_t document_start(const int32_t* doc_start, int64_t b, int64_t seq,
                                                  int64_t pos) {
  const int64_t first = doc_start[b * seq + pos];
  return first > 0 ? first : 0;
}

// The end of the positions that see key `key` (< T) of sequence b by their documents: the first
// position after `key` whose document starts after it, or T. As doc_start is non-decreasing,
// exactly the positions key .. end - 1 have doc_start <= key (and positions before `key` do not
// see it causally). A binary search over doc_start[b][key + 1 ..]: O(log T) loads.
__device__ __forceinline__ int64_t document_end(const int32_t* doc_start, int64_t b, int64_t seq,
                                                int64_t key) {
  const int32_t* starts = doc_start + b * seq;
  int64_t lo = key + 1, hi = seq;  // the end is in [key + 1, T]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (starts[mid] > key) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace moepeak::ops::cuda
