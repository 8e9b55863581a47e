// test_backend_ops cases: grouped linear forward and backward (ops/grouped_linear.h; the CUDA
// side is one cublasGemmGroupedBatchedEx per product, ops/cuda/grouped_linear.cpp).
//   build/tests/ops/test_backend_ops --gtest_filter='*grouped_linear*'
//   MOEPEAK_BACKEND_OPS=cpu build/tests/ops/test_backend_ops --gtest_filter='*grouped_linear*'
//
// x (M, K) with rows grouped by offsets (G + 1, 0 to M), one w_g (N, K) per group, y (M, N).
// Layouts: an empty group in the middle, empty first and last groups, one group (G = 1), tiny
// 1x1 products, odd sizes whose group row blocks start at pointers aligned to the element only
// (bf16 rows of 257 or 65 elements), and no rows at all; forward also with K == 0 and backward
// with N == 0 (the CUDA op's per-group fallback, which writes zeros). Each flag is covered:
// accumulate on and off; dx written, accumulated or undefined; dw for every group, for the even
// groups only (odd ones undefined) or none (an empty span). bf16 keeps the default 1e-2: inputs
// are exact in bf16, products accumulate in fp32 and each output is rounded once (2^-8 of the
// element at most). Backward also runs with f32 dw_g (Kind::state) for a bf16 x, the fp32 main
// gradient (ops/grouped_linear.h, both backends; on CUDA one bf16 x bf16 -> f32 cuBLASLt GEMM per
// group beside the grouped dx call): 1e-5 when the dw_g are the only outputs, else bf16's 1e-2 for
// the bf16 dx.
// The per-group loop `bench gemm` times against the grouped call (ops::set_grouped_gemm_per_group,
// with cuBLASLt's first and last heuristic algorithms) on the odd-size layout, forward and
// backward.
#include <string>
#include <vector>

#include "ops/grouped_linear.h"
#include "ops/linear.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {
namespace {

struct Layout {
  std::vector<int64_t> offsets;
  int64_t k, n;
  int64_t m() const { return offsets.back(); }
  size_t groups() const { return offsets.size() - 1; }
  std::string name() const {
    std::string s = " G=" + std::to_string(groups()) + " offsets=";
    for (size_t i = 0; i < offsets.size(); ++i) s += (i ? "," : "") + std::to_string(offsets[i]);
    return s + " K=" + std::to_string(k) + " N=" + std::to_string(n);
  }
};

enum class DwMode { all, even, none };

// What a backward call forms.
struct Grads {
  bool dx;
  bool accumulate_dx;
  DwMode dw;
  std::string name() const {
    return std::string(" dx=") + (dx ? (accumulate_dx ? "acc" : "write") : "none") + " dw=" +
           (dw == DwMode::all    ? "all"
            : dw == DwMode::even ? "even"
                                 : "none");
  }
};

// x, then w_0 .. w_{G-1}: the tensors every case starts with.
std::vector<TensorSpec> inputs(const Layout& l) {
  std::vector<TensorSpec> t{in("x", {l.m(), l.k})};
  for (size_t g = 0; g < l.groups(); ++g) t.push_back(in("w" + std::to_string(g), {l.n, l.k}));
  return t;
}

std::vector<Tensor> weights_of(const std::vector<Tensor>& v, size_t groups) {
  return std::vector<Tensor>(v.begin() + 1, v.begin() + 1 + static_cast<ptrdiff_t>(groups));
}

OpCase forward_case(const Layout& l, bool accumulate) {
  std::vector<TensorSpec> t = inputs(l);
  t.push_back(accumulate ? inout("y", {l.m(), l.n}) : out("y", {l.m(), l.n}));
  const size_t G = l.groups();
  return OpCase{"grouped_linear_forward" + l.name() + (accumulate ? " accumulate" : ""), t,
                [l, G, accumulate](const std::vector<Tensor>& v, Stream& st) {
                  ops::grouped_linear_forward(v[0], weights_of(v, G), l.offsets, v[G + 1],
                                              accumulate, st);
                }};
}

// dw_kind state: f32 dw_g whatever the storage; with mixed, only the even groups' (the odd ones
// in the storage's dtype, so a bf16 run passes both in one call).
OpCase backward_case(const Layout& l, const Grads& g, Kind dw_kind = Kind::floating,
                     bool mixed = false) {
  std::vector<TensorSpec> t = inputs(l);
  const size_t G = l.groups();
  t.push_back(in("dy", {l.m(), l.n}));
  int dx = -1;
  if (g.dx) {
    dx = static_cast<int>(t.size());
    t.push_back(g.accumulate_dx ? inout("dx", {l.m(), l.k}) : out("dx", {l.m(), l.k}));
  }
  std::vector<int> dw(G, -1);  // tensor index of dw_g, -1 when not passed
  for (size_t i = 0; i < G && g.dw != DwMode::none; ++i) {
    if (g.dw == DwMode::even && i % 2 == 1) continue;
    dw[i] = static_cast<int>(t.size());
    const Kind kind = mixed && i % 2 == 1 ? Kind::floating : dw_kind;
    t.push_back(inout("dw" + std::to_string(i), {l.n, l.k}, kind));  // always accumulated
  }
  const bool acc = g.accumulate_dx;
  const bool any_dw = g.dw != DwMode::none;
  return OpCase{"grouped_linear_backward" + l.name() + g.name() +
                    (dw_kind == Kind::state ? (mixed ? " dw_f32_even" : " dw_f32") : ""),
                t, [l, G, dx, dw, acc, any_dw](const std::vector<Tensor>& v, Stream& st) {
                  std::vector<Tensor> grads;
                  for (size_t i = 0; i < G && any_dw; ++i) {
                    grads.push_back(dw[i] >= 0 ? v[static_cast<size_t>(dw[i])] : Tensor());
                  }
                  ops::grouped_linear_backward(v[0], weights_of(v, G), l.offsets, v[G + 1],
                                               dx >= 0 ? v[static_cast<size_t>(dx)] : Tensor(), acc,
                                               grads, st);
                }};
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(grouped_linear) {
  std::vector<OpCase> cases;
  const std::vector<Layout> layouts{
      {{0, 5, 5, 17, 30}, 96, 50},      // empty group in the middle
      {{0, 0, 13, 13}, 64, 32},         // empty first and last groups
      {{0, 37}, 96, 50},                // one group
      {{0, 1, 2, 3}, 1, 1},             // 1x1 products
      {{0, 70, 70, 71, 200}, 257, 65},  // odd sizes: row blocks aligned to the element only
      {{0, 0, 0}, 64, 32},              // no rows at all
  };
  const std::vector<Grads> grads{
      {true, false, DwMode::all},  {true, true, DwMode::all},  {false, false, DwMode::all},
      {true, false, DwMode::none}, {true, true, DwMode::even}, {false, false, DwMode::even},
  };
  std::vector<Layout> forward_layouts = layouts, backward_layouts = layouts;
  forward_layouts.push_back({{0, 3, 3, 7}, 0, 5});   // K == 0: y = 0, or unchanged with accumulate
  backward_layouts.push_back({{0, 3, 3, 7}, 7, 0});  // N == 0: dx = 0, or unchanged
  for (const Layout& l : forward_layouts) {
    for (bool acc : {false, true}) cases.push_back(forward_case(l, acc));
  }
  for (const Layout& l : backward_layouts) {
    for (const Grads& g : grads) cases.push_back(backward_case(l, g));
  }
  // Neither gradient: a valid call that forms nothing.
  cases.push_back(backward_case(layouts[0], {false, false, DwMode::none}));
  // f32 dw_g for a bf16 x (see the top of the file): on a layout whose rows are 16-byte aligned
  // (the grouped dx call beside the per-group dw GEMMs on CUDA), and on two whose row blocks are
  // not (every GEMM on its own). Also f32 dw_g for the even groups with bf16 ones for the odd
  // groups in one call (CUDA: the bf16 dw_g in the grouped call, the f32 ones per group).
  const Layout aligned{{0, 8, 8, 24, 40}, 64, 32};  // bf16 rows of 128 and 64 bytes
  for (const Layout& l : {aligned, layouts[0], layouts[4]}) {
    for (const Grads& g : {Grads{true, true, DwMode::even}, Grads{false, false, DwMode::all}}) {
      OpCase c = backward_case(l, g, Kind::state);
      if (!g.dx) c.tolerance = Tolerance{1e-5, 1e-5};
      cases.push_back(std::move(c));
    }
  }
  for (const Layout& l : {aligned, layouts[4]}) {
    cases.push_back(backward_case(l, {true, false, DwMode::all}, Kind::state, /*mixed=*/true));
  }
  // The per-group loop `bench gemm` compares the grouped call with: the same results within the
  // dtype's tolerance, at the first and the last algorithm rank (the CPU ignores both settings).
  for (int rank : {0, ops::kGemmAlgorithmRanks - 1}) {
    for (OpCase c :
         {forward_case(layouts[4], true), backward_case(layouts[4], {true, true, DwMode::even})}) {
      c.name += " per_group algorithm_rank=" + std::to_string(rank);
      c.run = [rank, run = c.run](const std::vector<Tensor>& v, Stream& st) {
        const bool previous = ops::set_grouped_gemm_per_group(true);
        const int previous_rank = ops::set_gemm_algorithm_rank(rank);
        run(v, st);
        ops::set_gemm_algorithm_rank(previous_rank);
        ops::set_grouped_gemm_per_group(previous);
      };
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
