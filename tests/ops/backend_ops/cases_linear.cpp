// test_backend_ops cases: linear forward and backward, plain and on a column block of w
// (ops/linear.h; the CUDA side is cuBLASLt, ops/cuda/linear.cpp).
//   build/tests/ops/test_backend_ops --gtest_filter='*linear*'
//   MOEPEAK_BACKEND_OPS=cpu build/tests/ops/test_backend_ops --gtest_filter='*linear*'
//
// Shapes (M, K, N): x (M, K), w (N, K) or (N, K_w), y (M, N). Each flag is covered: accumulate
// on and off, dx written, accumulated or undefined, dw given or undefined. M == 0 is an expert
// with no tokens, K == 0 an empty inner dimension (y written as zeros), N == 0 an empty output
// (dx written as zeros). Column blocks start at an even k0 (aligned rows) and at odd ones, whose
// pointers are aligned to the element size only. Two shapes also run with other cuBLASLt
// algorithms than the heuristic's first (ops::set_gemm_algorithm_rank). bf16 keeps the default
// 1e-2: the inputs are exact in bf16, products accumulate in fp32, and the result is rounded once
// to bf16 (2^-8 of the element at most). Backward also runs with an f32 dw (Kind::state) for a
// bf16 x, the fp32 main gradient (ops/linear.h, both backends; on CUDA a bf16 x bf16 -> f32
// cuBLASLt GEMM): fp32 accumulation of exact inputs, so 1e-5 in both storages when dw is the only
// output (with a bf16 dx the case keeps bf16's 1e-2).
#include <string>
#include <vector>

#include "ops/linear.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {
namespace {

struct Mkn {
  int64_t m, k, n;
};

std::string shape_name(const Mkn& s) {
  return " M=" + std::to_string(s.m) + " K=" + std::to_string(s.k) + " N=" + std::to_string(s.n);
}

// What a backward call forms: dx (written or accumulated) or not, dw or not.
struct Grads {
  bool dx;
  bool accumulate_dx;
  bool dw;
  std::string name() const {
    return std::string(" dx=") + (dx ? (accumulate_dx ? "acc" : "write") : "none") +
           " dw=" + (dw ? "acc" : "none");
  }
};

// The forward case; a column block when k0 >= 0 (w is (N, K_w)), the plain op otherwise.
OpCase forward_case(const Mkn& s, bool accumulate, int64_t k0, int64_t kw) {
  const bool cols = k0 >= 0;
  std::string name = std::string(cols ? "linear_forward_cols" : "linear_forward") + shape_name(s) +
                     (cols ? " k0=" + std::to_string(k0) + " K_w=" + std::to_string(kw) : "") +
                     (accumulate ? " accumulate" : "");
  std::vector<TensorSpec> t{in("x", {s.m, s.k}), in("w", {s.n, cols ? kw : s.k})};
  t.push_back(accumulate ? inout("y", {s.m, s.n}) : out("y", {s.m, s.n}));
  return OpCase{name, t, [cols, k0, accumulate](const std::vector<Tensor>& v, Stream& st) {
                  if (cols) {
                    ops::linear_forward_cols(v[0], v[1], k0, v[2], accumulate, st);
                  } else {
                    ops::linear_forward(v[0], v[1], v[2], accumulate, st);
                  }
                }};
}

// The backward case, as forward_case; undefined gradients are passed as Tensor(). dw_kind state:
// an f32 dw whatever the storage.
OpCase backward_case(const Mkn& s, const Grads& g, int64_t k0, int64_t kw,
                     Kind dw_kind = Kind::floating) {
  const bool cols = k0 >= 0;
  const int64_t wk = cols ? kw : s.k;
  std::string name = std::string(cols ? "linear_backward_cols" : "linear_backward") +
                     shape_name(s) +
                     (cols ? " k0=" + std::to_string(k0) + " K_w=" + std::to_string(kw) : "") +
                     g.name() + (dw_kind == Kind::state ? " dw_f32" : "");
  std::vector<TensorSpec> t{in("x", {s.m, s.k}), in("w", {s.n, wk}), in("dy", {s.m, s.n})};
  int dx = -1, dw = -1;
  if (g.dx) {
    dx = static_cast<int>(t.size());
    t.push_back(g.accumulate_dx ? inout("dx", {s.m, s.k}) : out("dx", {s.m, s.k}));
  }
  if (g.dw) {
    dw = static_cast<int>(t.size());
    // Always accumulated; outside the block unchanged.
    t.push_back(inout("dw", {s.n, wk}, dw_kind));
  }
  const bool acc = g.accumulate_dx;
  return OpCase{name, t, [cols, k0, acc, dx, dw](const std::vector<Tensor>& v, Stream& st) {
                  const Tensor none;
                  const Tensor& gx = dx >= 0 ? v[static_cast<size_t>(dx)] : none;
                  const Tensor& gw = dw >= 0 ? v[static_cast<size_t>(dw)] : none;
                  if (cols) {
                    ops::linear_backward_cols(v[0], v[1], k0, v[2], gx, acc, gw, st);
                  } else {
                    ops::linear_backward(v[0], v[1], v[2], gx, acc, gw, st);
                  }
                }};
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(linear) {
  std::vector<OpCase> cases;
  const std::vector<Mkn> shapes{{37, 96, 50}, {1, 1, 1}, {0, 64, 32}, {130, 257, 65}};
  const std::vector<Grads> grads{
      {false, false, true}, {true, false, true}, {true, true, true},
      {true, false, false}, {true, true, false},
  };

  // Plain op. Forward also with K == 0 (y = 0, or unchanged with accumulate); backward also with
  // N == 0 (dx = 0, or unchanged with accumulate_dx).
  std::vector<Mkn> forward_shapes = shapes, backward_shapes = shapes;
  forward_shapes.push_back({37, 0, 50});
  backward_shapes.push_back({5, 7, 0});
  for (const Mkn& s : forward_shapes) {
    for (bool acc : {false, true}) cases.push_back(forward_case(s, acc, -1, 0));
  }
  for (const Mkn& s : backward_shapes) {
    for (const Grads& g : grads) cases.push_back(backward_case(s, g, -1, 0));
  }
  // Neither gradient: a valid call that forms nothing.
  cases.push_back(backward_case({37, 96, 50}, {false, false, false}, -1, 0));

  // Column blocks w[:, k0 : k0 + K] of an (N, K_w) w: an even k0 with columns left on both sides,
  // odd k0 (pointers aligned to one element), and blocks that end at K_w.
  struct Block {
    Mkn s;
    int64_t k0, kw;
  };
  const std::vector<Block> blocks{{{37, 96, 50}, 8, 109},   {{37, 96, 50}, 3, 99},
                                  {{1, 1, 1}, 3, 5},        {{0, 64, 32}, 3, 70},
                                  {{130, 257, 65}, 1, 264}, {{130, 257, 65}, 7, 264}};
  for (const Block& b : blocks) {
    for (bool acc : {false, true}) cases.push_back(forward_case(b.s, acc, b.k0, b.kw));
    for (const Grads& g : grads) cases.push_back(backward_case(b.s, g, b.k0, b.kw));
  }

  // An f32 dw for a bf16 x (see the top of the file), plain and on column blocks (an odd k0: dw's
  // pointer aligned to its 4-byte element only).
  for (OpCase c : {backward_case({37, 96, 50}, {true, false, true}, -1, 0, Kind::state),
                   backward_case({130, 257, 65}, {false, false, true}, -1, 0, Kind::state),
                   backward_case({130, 257, 65}, {true, true, true}, 7, 264, Kind::state),
                   backward_case({0, 64, 32}, {true, false, true}, 3, 70, Kind::state)}) {
    if (c.tensors.size() == 4) c.tolerance = Tolerance{1e-5, 1e-5};  // x, w, dy, dw: no dx
    cases.push_back(std::move(c));
  }

  // The other algorithms `bench gemm` times (ops::set_gemm_algorithm_rank): the same results
  // within the dtype's tolerance whichever of cuBLASLt's candidates runs (the CPU ignores it).
  for (int rank : {1, ops::kGemmAlgorithmRanks - 1}) {
    for (OpCase c : {forward_case({130, 257, 65}, true, -1, 0),
                     backward_case({130, 257, 65}, {true, true, true}, -1, 0)}) {
      c.name += " algorithm_rank=" + std::to_string(rank);
      c.run = [rank, run = c.run](const std::vector<Tensor>& v, Stream& st) {
        const int previous = ops::set_gemm_algorithm_rank(rank);
        run(v, st);
        ops::set_gemm_algorithm_rank(previous);
      };
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
