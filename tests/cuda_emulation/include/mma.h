// nvcuda::wmma for the CPU emulation of CUDA: warp-wide matrix tiles whose elements are spread
// over the 32 lanes of the warp, as on the hardware, so that a kernel only sees a whole tile
// through the warp-collective load, mma and store, each of which every lane of the warp must
// reach (a lane that does not is the emulation's warp-collective error, not a silent result).
//
//   tile (rows x cols) element e = i * 32 + lane is x[i] of lane `lane` (i < num_elements);
//   row = e / cols, col = e % cols. Real hardware uses another mapping: code that reads x[i]
//   as a particular (row, col) is wrong on both, and code that treats x[] uniformly is right.
//
// mma_sync multiplies in fp32 in k order (tensor cores round and order differently: tests of
// tensor-core kernels compare within a tolerance). Shapes: m16n16k16; a, b in bf16, float
// accumulators.
#pragma once

#include <cuda_bf16.h>

#include "tests/cuda_emulation/device_prelude.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <typename Use, int M, int N, int K>
struct tile_shape;
template <int M, int N, int K>
struct tile_shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct tile_shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct tile_shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};
inline int lane() { return static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y) & 31; }
inline float as_float(float v) { return v; }
inline float as_float(__nv_bfloat16 v) { return static_cast<float>(v); }
template <typename T>
T from_float(float v) {
  return T(v);
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
 public:
  static constexpr int rows = detail::tile_shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::tile_shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols / 32;
  using element_type = T;
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T value) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}

// Every lane loads its elements; (row, col) of the tile is at p[row * ldm + col] (row-major) or
// p[col * ldm + row] (column-major).
template <typename Use, int M, int N, int K, typename T, typename Layout, typename S>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const S* p, unsigned ldm,
                             bool column_major) {
  __syncwarp();
  const int lane = detail::lane();
  for (int i = 0; i < f.num_elements; ++i) {
    const int e = i * 32 + lane, r = e / f.cols, c = e % f.cols;
    f.x[i] = column_major ? p[size_t(c) * ldm + r] : p[size_t(r) * ldm + c];
  }
  __syncwarp();
}
template <typename Use, int M, int N, int K, typename T, typename S>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, const S* p, unsigned ldm) {
  load_matrix_sync(f, p, ldm, false);
}
template <typename Use, int M, int N, int K, typename T, typename S>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, const S* p, unsigned ldm) {
  load_matrix_sync(f, p, ldm, true);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm,
                             layout_t layout) {
  load_matrix_sync(f, p, ldm, layout == mem_col_major);
}

template <int M, int N, int K, typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                              layout_t layout) {
  __syncwarp();
  const int lane = detail::lane();
  for (int i = 0; i < f.num_elements; ++i) {
    const int e = i * 32 + lane, r = e / f.cols, c = e % f.cols;
    (layout == mem_col_major ? p[size_t(c) * ldm + r] : p[size_t(r) * ldm + c]) = f.x[i];
  }
  __syncwarp();
}

namespace detail {
// The fragments every lane of the warp passed to the mma in progress (block-shared scratch of
// the emulation's own: the hardware exchanges them in registers, so it does not count against
// the kernel's shared memory).
struct MmaOperands {
  const void* a;
  const void* b;
};
inline MmaOperands* warp_operands() {
  static const char site = 0;
  return &::moepeak::cuda_emulation::emulation_scratch<MmaOperands[1024]>(&site)[0];
}
}  // namespace detail

// d = a b + c over the whole warp: every lane publishes its a and b, then computes its own
// elements of d from every lane's; d may be c.
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC>& d,
                     const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b,
                     const fragment<accumulator, M, N, K, TC>& c) {
  using FragA = fragment<matrix_a, M, N, K, TA, LA>;
  using FragB = fragment<matrix_b, M, N, K, TB, LB>;
  const int thread = static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y);
  const int lane = thread & 31, warp_base = thread - lane;
  detail::MmaOperands* ops = detail::warp_operands();
  ops[thread] = {&a, &b};
  __syncwarp();
  auto a_at = [&](int r, int k) {
    const int e = r * K + k;
    return detail::as_float(static_cast<const FragA*>(ops[warp_base + e % 32].a)->x[e / 32]);
  };
  auto b_at = [&](int k, int col) {
    const int e = k * N + col;
    return detail::as_float(static_cast<const FragB*>(ops[warp_base + e % 32].b)->x[e / 32]);
  };
  TC out[fragment<accumulator, M, N, K, TC>::num_elements];
  for (int i = 0; i < d.num_elements; ++i) {
    const int e = i * 32 + lane, r = e / N, col = e % N;
    float sum = detail::as_float(c.x[i]);
    for (int k = 0; k < K; ++k) sum += a_at(r, k) * b_at(k, col);
    out[i] = detail::from_float<TC>(sum);
  }
  __syncwarp();  // every lane has read the others' a and b before any returns
  for (int i = 0; i < d.num_elements; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
