// CPU grouped linear (see ops/grouped_linear.h): the loop over the non-empty groups of the CPU
// linear entry points (ops/cpu/linear.cpp), each on its group's rows,
//   forward   y[g rows] (M_g, N)  (+)= x[g rows] (M_g, K) . w_g^T
//   backward  dx[g rows] (M_g, K) (+)= dy[g rows] (M_g, N) . w_g (N, K)
//             dw_g (N, K)          += dy[g rows]^T . x[g rows]
// so every result is bitwise the per-expert loop's (bf16 storage included: the same gemm_bf16
// calls, ops/cpu/gemm_tiles.h). Also the argument checks both backends share.
// Test: ctest -R test_grouped_linear;
//       MOEPEAK_BACKEND_OPS=cpu test_backend_ops --gtest_filter='*grouped_linear*'.
#include "ops/grouped_linear.h"

#include <string>

#include "ops/cpu/cpu_storage.h"
#include "ops/linear.h"

namespace moepeak::ops {
namespace {

// Given: defined, or shaped like an empty (0, K) tensor that has no bytes (ops/linear.h).
bool given(const Tensor& t) { return t.defined() || t.ndim() > 0; }

std::string group_label(const char* op, size_t g) {
  return std::string(op) + ": group " + std::to_string(g);
}

}  // namespace

int64_t check_grouped_linear_args(const char* op, const Tensor& x, std::span<const Tensor> w,
                                  std::span<const int64_t> offsets) {
  MOEPEAK_CHECK(x.ndim() == 2, op, ": x must be (M, K), got ", x.str());
  MOEPEAK_CHECK(!w.empty(), op, ": needs at least one group (one weight), got none");
  const size_t G = w.size();
  MOEPEAK_CHECK(offsets.size() == G + 1, op, ": ", G, " weights need ", G + 1, " row offsets, got ",
                offsets.size());
  const int64_t M = x.size(0), K = x.size(1);
  MOEPEAK_CHECK(offsets[0] == 0, op, ": offsets[0] must be 0, got ", offsets[0]);
  for (size_t g = 0; g < G; ++g) {
    MOEPEAK_CHECK(offsets[g + 1] >= offsets[g], group_label(op, g), ": rows [", offsets[g], ", ",
                  offsets[g + 1], ") end before they begin (offsets must not decrease)");
  }
  MOEPEAK_CHECK(offsets[G] == M, op, ": offsets[", G, "] = ", offsets[G], " must be the rows of x ",
                x.str());
  const int64_t N = w[0].ndim() == 2 ? w[0].size(0) : -1;
  for (size_t g = 0; g < G; ++g) {
    MOEPEAK_CHECK(
        w[g].ndim() == 2 && w[g].dtype() == x.dtype() && w[g].size(0) == N && w[g].size(1) == K,
        group_label(op, g), ": w must be ", dtype_name(x.dtype()), " (", N, ", ", K,
        ") like group 0's rows and x's columns (x ", x.str(), "), got ", w[g].str());
  }
  return N;
}

void check_grouped_linear_forward_args(const char* op, const Tensor& x, std::span<const Tensor> w,
                                       std::span<const int64_t> offsets, const Tensor& y) {
  const int64_t N = check_grouped_linear_args(op, x, w, offsets);
  y.expect(Shape{x.size(0), N}, x.dtype(), std::string(op) + ": y");
}

GroupedLinearGrads check_grouped_linear_backward_args(const char* op, const Tensor& x,
                                                      std::span<const Tensor> w,
                                                      std::span<const int64_t> offsets,
                                                      const Tensor& dy, const Tensor& dx,
                                                      std::span<const Tensor> dw) {
  const int64_t N = check_grouped_linear_args(op, x, w, offsets);
  dy.expect(Shape{x.size(0), N}, x.dtype(), std::string(op) + ": dy");
  GroupedLinearGrads want;
  want.dx = given(dx);
  if (want.dx) dx.expect(x.shape(), x.dtype(), std::string(op) + ": dx");
  want.dw.assign(w.size(), false);
  if (dw.empty()) return want;
  MOEPEAK_CHECK(dw.size() == w.size(), op,
                ": dw must be empty (no weight gradients) or one per "
                "group (",
                w.size(), "), got ", dw.size());
  for (size_t g = 0; g < w.size(); ++g) {
    want.dw[g] = given(dw[g]);
    if (!want.dw[g]) continue;
    const bool f32_dw = x.dtype() == DType::bf16 && dw[g].dtype() == DType::f32;
    dw[g].expect(w[g].shape(), f32_dw ? DType::f32 : x.dtype(), group_label(op, g) + ": dw");
  }
  return want;
}

void grouped_linear_forward_cpu(const Tensor& x, std::span<const Tensor> w,
                                std::span<const int64_t> offsets, const Tensor& y, bool accumulate,
                                Stream& stream) {
  const char* op = "grouped_linear_forward_cpu";
  check_grouped_linear_forward_args(op, x, w, offsets, y);
  dispatch_storage(x.dtype(), op, [](auto) {});  // the dtype check, also when every group is empty
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t lo = offsets[g], hi = offsets[g + 1];
    if (lo == hi) continue;
    linear_forward_cpu(x.rows(lo, hi), w[g], y.rows(lo, hi), accumulate, stream);
  }
}

void grouped_linear_backward_cpu(const Tensor& x, std::span<const Tensor> w,
                                 std::span<const int64_t> offsets, const Tensor& dy,
                                 const Tensor& dx, bool accumulate_dx, std::span<const Tensor> dw,
                                 Stream& stream) {
  const char* op = "grouped_linear_backward_cpu";
  const GroupedLinearGrads want = check_grouped_linear_backward_args(op, x, w, offsets, dy, dx, dw);
  dispatch_storage(x.dtype(), op, [](auto) {});
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t lo = offsets[g], hi = offsets[g + 1];
    if (lo == hi) continue;  // no rows: dx has none, dw_g += 0
    if (!want.dx && !want.dw[g]) continue;
    linear_backward_cpu(x.rows(lo, hi), w[g], dy.rows(lo, hi), want.dx ? dx.rows(lo, hi) : Tensor(),
                        accumulate_dx, want.dw[g] ? dw[g] : Tensor(), stream);
  }
}

bool set_grouped_gemm_per_group(bool per_group) {
#ifdef MOEPEAK_WITH_CUDA
  return set_grouped_gemm_per_group_cuda(per_group);
#else
  (void)per_group;
  return true;  // the CPU runs one GEMM per group always
#endif
}

}  // namespace moepeak::ops
