// Grouped linear on the CPU backend (ops/grouped_linear.h): the experts' projections of one MoE
// layer in one call. For several group layouts (empty groups first, in the middle and last, one
// group, no rows at all) and every storage (f64, f32, bf16, and bf16 with f32 dw: the fp32 main
// gradient), forward and backward are checked
//   - bitwise against the loop over groups of ops::linear_forward / linear_backward on each
//     group's rows (what the dispatch schedules ran before, so their exactness tests still hold);
//   - against a plain float64 reference in this file: 1e-12 of the output's scale in f64 (only
//     summation order differs), 1e-5 in f32 and for an f32 dw of bf16 inputs (inputs rounded to
//     the storage first, at most 150 fp32 products per element), 5e-3 for bf16 outputs (one
//     rounding to bf16, 2^-8 relative, after the fp32 sum: ops/cpu/gemm_tiles.h);
// with accumulate on and off, dx written, accumulated or undefined, dw for every group, for some
// groups (others undefined) or none (an empty span); written outputs are poisoned with NaN first
// and accumulated ones start from random values. Bad arguments throw moepeak::Error naming the
// op, the group and the mismatch.
// Run: ctest --test-dir build -R test_grouped_linear (or build/tests/ops/test_grouped_linear)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/grouped_linear.h"
#include "ops/linear.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::make_input;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_float;

// The storages a run uses: x, w, y, dy, dx in `dtype`; dw in `dw` (x's dtype, or f32 for bf16).
struct Storage {
  DType dtype;
  DType dw;
  std::string name() const {
    return std::string(dtype_name(dtype)) +
           (dw != dtype ? " dw " + std::string(dtype_name(dw)) : "");
  }
};
const std::vector<Storage>& storages() {
  static const std::vector<Storage> s{{DType::f32, DType::f32},
                                      {DType::f64, DType::f64},
                                      {DType::bf16, DType::bf16},
                                      {DType::bf16, DType::f32}};
  return s;
}

// Tensors of any float storage (OpEnv's helpers take f32 and f64): NaN-poisoned outputs and reads
// as doubles (inputs: dense_ops_testing.h's make_input).
OwnedTensor make_output(OpEnv& env, Shape shape, DType dtype) {
  if (dtype != DType::bf16) return env.output(shape, dtype);
  env.stream().synchronize();
  auto t = OwnedTensor::device(env.backend(), shape, dtype, LiveSet::workspace, "test output");
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<bf16>()[i] = bf16(NAN);
  return t;
}
std::vector<double> read(OpEnv& env, const Tensor& t) {
  if (t.dtype() != DType::bf16) return env.read(t);
  env.stream().synchronize();
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(t.data_as<bf16>()[i]);
  return out;
}

std::vector<double> rounded_to_bf16(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(bf16(static_cast<float>(x)));
  return v;
}

// Rows grouped by offsets (G + 1 entries, 0 to M); x (M, K), every w_g (N, K).
struct Layout {
  std::vector<int64_t> offsets;
  int64_t k = 0, n = 0;
  int64_t m() const { return offsets.back(); }
  size_t groups() const { return offsets.size() - 1; }
  std::string name() const {
    std::string s = "offsets {";
    for (size_t i = 0; i < offsets.size(); ++i) s += (i ? ", " : "") + std::to_string(offsets[i]);
    return s + "} K=" + std::to_string(k) + " N=" + std::to_string(n);
  }
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> l{
      {{0, 4, 4, 9, 13}, 7, 5},       // an empty group in the middle
      {{0, 0, 6, 11, 11}, 7, 5},      // empty first and last groups
      {{0, 9}, 7, 5},                 // one group
      {{0, 0, 0}, 7, 5},              // no rows at all
      {{0, 40, 40, 97, 150}, 96, 64}  // OpenBLAS's blocked kernels
  };
  return l;
}

// Inputs of one layout, rounded to float (or to bf16) so every dtype of the run holds them exactly.
struct Inputs {
  std::vector<double> x, dy, y0, dx0;
  std::vector<std::vector<double>> w, dw0;
};

Inputs make_inputs(const Layout& p, uint64_t seed, DType dtype = DType::f32) {
  const auto m = static_cast<size_t>(p.m()), k = static_cast<size_t>(p.k),
             n = static_cast<size_t>(p.n);
  Inputs in;
  in.x = rounded_to_float(random_vector(m * k, seed));
  in.dy = rounded_to_float(random_vector(m * n, seed + 1));
  in.y0 = rounded_to_float(random_vector(m * n, seed + 2));
  in.dx0 = rounded_to_float(random_vector(m * k, seed + 3));
  for (size_t g = 0; g < p.groups(); ++g) {
    in.w.push_back(rounded_to_float(random_vector(n * k, seed + 10 + g)));
    in.dw0.push_back(rounded_to_float(random_vector(n * k, seed + 100 + g)));
  }
  if (dtype == DType::bf16) {
    for (auto* v : {&in.x, &in.dy, &in.y0, &in.dx0}) *v = rounded_to_bf16(*v);
    for (auto& v : in.w) v = rounded_to_bf16(v);
    for (auto& v : in.dw0) v = rounded_to_bf16(v);
  }
  return in;
}

// ---- float64 references ---------------------------------------------------------------------

// y[r] (+)= x[r] w_g^T for the rows r of each group g.
std::vector<double> forward_reference(const Layout& p, const Inputs& in, bool accumulate) {
  const int64_t k = p.k, n = p.n;
  std::vector<double> y = accumulate ? in.y0 : std::vector<double>(in.y0.size(), 0.0);
  for (size_t g = 0; g < p.groups(); ++g) {
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t i = 0; i < k; ++i) s += in.x[r * k + i] * in.w[g][j * k + i];
        y[r * n + j] += s;
      }
    }
  }
  return y;
}

// dx[r] (+)= dy[r] w_g.
std::vector<double> dx_reference(const Layout& p, const Inputs& in, bool accumulate) {
  const int64_t k = p.k, n = p.n;
  std::vector<double> dx = accumulate ? in.dx0 : std::vector<double>(in.dx0.size(), 0.0);
  for (size_t g = 0; g < p.groups(); ++g) {
    for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += in.dy[r * n + j] * in.w[g][j * k + i];
        dx[r * k + i] += s;
      }
    }
  }
  return dx;
}

// dw_g += sum over the group's rows of dy[r]^T x[r].
std::vector<double> dw_reference(const Layout& p, const Inputs& in, size_t g) {
  const int64_t k = p.k, n = p.n;
  std::vector<double> dw = in.dw0[g];
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      double s = 0;
      for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; ++r) {
        s += in.dy[r * n + j] * in.x[r * k + i];
      }
      dw[j * k + i] += s;
    }
  }
  return dw;
}

// ---- runs: the grouped op, or the per-group loop of ops::linear_* -----------------------------

enum class Dx { write, accumulate, none };
enum class Dw { all, some, none };  // some: odd groups pass an undefined dw_g

std::string dx_name(Dx d) {
  return d == Dx::write ? "write" : d == Dx::accumulate ? "accumulate" : "none";
}
std::string dw_name(Dw d) { return d == Dw::all ? "all" : d == Dw::some ? "some" : "none"; }

std::vector<OwnedTensor> weights(OpEnv& env, DType dtype, const Layout& p,
                                 const std::vector<std::vector<double>>& values) {
  std::vector<OwnedTensor> w;
  for (const auto& v : values) w.push_back(make_input(env, {p.n, p.k}, dtype, v));
  return w;
}

std::vector<Tensor> views(const std::vector<OwnedTensor>& owned) {
  std::vector<Tensor> v;
  for (const auto& t : owned) v.push_back(t.view());
  return v;
}

std::vector<double> run_forward(OpEnv& env, DType dtype, const Layout& p, const Inputs& in,
                                bool accumulate, bool grouped) {
  auto x = make_input(env, {p.m(), p.k}, dtype, in.x);
  auto w_owned = weights(env, dtype, p, in.w);
  const std::vector<Tensor> w = views(w_owned);
  auto y = accumulate ? make_input(env, {p.m(), p.n}, dtype, in.y0)
                      : make_output(env, {p.m(), p.n}, dtype);
  if (grouped) {
    ops::grouped_linear_forward(x, w, p.offsets, y, accumulate, env.stream());
  } else {
    for (size_t g = 0; g < p.groups(); ++g) {
      const int64_t lo = p.offsets[g], hi = p.offsets[g + 1];
      ops::linear_forward(x.view().rows(lo, hi), w[g], y.view().rows(lo, hi), accumulate,
                          env.stream());
    }
  }
  return read(env, y);
}

struct Grads {
  std::vector<double> dx;               // empty with Dx::none
  std::vector<std::vector<double>> dw;  // every group's dw tensor (unchanged when not passed)
};

Grads run_backward(OpEnv& env, Storage storage, const Layout& p, const Inputs& in, Dx dx_mode,
                   Dw dw_mode, bool grouped) {
  const DType dtype = storage.dtype;
  auto x = make_input(env, {p.m(), p.k}, dtype, in.x);
  auto dy = make_input(env, {p.m(), p.n}, dtype, in.dy);
  auto w_owned = weights(env, dtype, p, in.w);
  auto dw_owned = weights(env, storage.dw, p, in.dw0);
  const std::vector<Tensor> w = views(w_owned);
  OwnedTensor dx_owned;
  if (dx_mode == Dx::write) dx_owned = make_output(env, {p.m(), p.k}, dtype);
  if (dx_mode == Dx::accumulate) dx_owned = make_input(env, {p.m(), p.k}, dtype, in.dx0);
  const Tensor dx = dx_mode == Dx::none ? Tensor() : dx_owned.view();
  std::vector<Tensor> dw;  // empty with Dw::none
  if (dw_mode != Dw::none) {
    for (size_t g = 0; g < p.groups(); ++g) {
      dw.push_back(dw_mode == Dw::some && g % 2 == 1 ? Tensor() : dw_owned[g].view());
    }
  }
  const bool acc = dx_mode == Dx::accumulate;
  if (grouped) {
    ops::grouped_linear_backward(x, w, p.offsets, dy, dx, acc, dw, env.stream());
  } else {
    for (size_t g = 0; g < p.groups(); ++g) {
      const int64_t lo = p.offsets[g], hi = p.offsets[g + 1];
      ops::linear_backward(x.view().rows(lo, hi), w[g], dy.view().rows(lo, hi),
                           dx.defined() ? dx.rows(lo, hi) : Tensor(), acc,
                           dw.empty() ? Tensor() : dw[g], env.stream());
    }
  }
  Grads out;
  if (dx.defined()) out.dx = read(env, dx);
  for (const auto& t : dw_owned) out.dw.push_back(read(env, t));
  return out;
}

// Bitwise equal (and so every element written: a NaN poison never equals itself).
void expect_bitwise(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]))
        << what << "[" << i << "]: grouped " << got[i] << ", per-group loop " << want[i];
  }
}

double tolerance(DType dtype) {
  return dtype == DType::f64 ? kForwardTol : dtype == DType::bf16 ? 5e-3 : kFloatVsDoubleTol;
}

// ---------------------------------------------------------------------------------------------

TEST(GroupedLinear, ForwardIsThePerGroupLoopBitwiseAndMatchesFloat64) {
  OpEnv env;
  uint64_t seed = 1;
  for (const Layout& p : layouts()) {
    seed += 1000;
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      const Inputs in = make_inputs(p, seed, dtype);
      for (bool accumulate : {false, true}) {
        const std::string what = p.name() + " " + std::string(dtype_name(dtype)) +
                                 (accumulate ? " accumulate" : "") + ": y";
        const auto grouped = run_forward(env, dtype, p, in, accumulate, true);
        const auto loop = run_forward(env, dtype, p, in, accumulate, false);
        expect_bitwise(grouped, loop, what);
        EXPECT_LE(max_scaled_err(grouped, forward_reference(p, in, accumulate)), tolerance(dtype))
            << what;
      }
    }
  }
}

TEST(GroupedLinear, BackwardIsThePerGroupLoopBitwiseAndMatchesFloat64) {
  OpEnv env;
  uint64_t seed = 7;
  for (const Layout& p : layouts()) {
    seed += 1000;
    for (const Storage& storage : storages()) {
      const DType dtype = storage.dtype;
      const Inputs in = make_inputs(p, seed, dtype);
      for (Dx dx_mode : {Dx::write, Dx::accumulate, Dx::none}) {
        for (Dw dw_mode : {Dw::all, Dw::some, Dw::none}) {
          const std::string what = p.name() + " " + storage.name() + " dx=" + dx_name(dx_mode) +
                                   " dw=" + dw_name(dw_mode);
          const Grads grouped = run_backward(env, storage, p, in, dx_mode, dw_mode, true);
          const Grads loop = run_backward(env, storage, p, in, dx_mode, dw_mode, false);
          expect_bitwise(grouped.dx, loop.dx, what + ": dx");
          if (dx_mode != Dx::none) {
            EXPECT_LE(max_scaled_err(grouped.dx, dx_reference(p, in, dx_mode == Dx::accumulate)),
                      tolerance(dtype))
                << what << ": dx";
          } else {
            EXPECT_TRUE(grouped.dx.empty()) << what;
          }
          for (size_t g = 0; g < p.groups(); ++g) {
            const std::string name = what + ": dw[" + std::to_string(g) + "]";
            expect_bitwise(grouped.dw[g], loop.dw[g], name);
            const bool formed = dw_mode == Dw::all || (dw_mode == Dw::some && g % 2 == 0);
            // A gradient not asked for, or of a group with no rows, keeps its starting values.
            const std::vector<double> want = formed ? dw_reference(p, in, g) : in.dw0[g];
            if (!formed || p.offsets[g] == p.offsets[g + 1]) {
              expect_bitwise(grouped.dw[g], in.dw0[g], name + " (untouched)");
            }
            EXPECT_LE(max_scaled_err(grouped.dw[g], want), tolerance(storage.dw)) << name;
          }
        }
      }
    }
  }
}

// Argument errors throw at the call, naming the op, the group and what is wrong.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& part : parts) EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

TEST(GroupedLinear, RejectsBadArgumentsAtTheCall) {
  OpEnv env;
  const DType f = DType::f64;
  const Layout p{{0, 3, 3, 8}, 4, 6};
  const Inputs in = make_inputs(p, 5);
  auto x = env.input({8, 4}, f, in.x);
  auto y = env.output({8, 6}, f);
  auto dy = env.input({8, 6}, f, in.dy);
  auto dx = env.output({8, 4}, f);
  auto w_owned = weights(env, f, p, in.w);
  const std::vector<Tensor> w = views(w_owned);
  auto dw_owned = weights(env, f, p, in.dw0);
  const std::vector<Tensor> dw = views(dw_owned);
  const std::vector<int64_t> offsets = p.offsets;
  Stream& s = env.stream();
  const char* fwd = "grouped_linear_forward_cpu";
  const char* bwd = "grouped_linear_backward_cpu";

  // Offsets: count, start, order, end.
  auto forward_with = [&](std::vector<int64_t> o) {
    return [&, o] { ops::grouped_linear_forward(x, w, o, y, false, s); };
  };
  expect_error(forward_with({0, 3, 8}), {fwd, "3 weights need 4 row offsets"});
  expect_error(forward_with({1, 3, 3, 8}), {fwd, "offsets[0]"});
  expect_error(forward_with({0, 5, 3, 8}), {fwd, "group 1", "must not decrease"});
  expect_error(forward_with({0, 3, 3, 7}), {fwd, "offsets[3] = 7", "rows of x"});
  expect_error(
      [&] {
        ops::grouped_linear_forward(x, std::vector<Tensor>{}, std::vector<int64_t>{0}, y, false, s);
      },
      {fwd, "at least one group"});

  // Weights: K, N, dtype of one group.
  auto w_bad_k = env.input({6, 5}, f, std::vector<double>(30, 1.0));
  auto w_bad_n = env.input({7, 4}, f, std::vector<double>(28, 1.0));
  auto w_f32 = env.input({6, 4}, DType::f32, std::vector<double>(24, 1.0));
  for (const Tensor& bad : {w_bad_k.view(), w_bad_n.view(), w_f32.view()}) {
    std::vector<Tensor> wb = w;
    wb[1] = bad;
    expect_error([&] { ops::grouped_linear_forward(x, wb, offsets, y, false, s); },
                 {fwd, "group 1", "w must be f64 (6, 4)", bad.str()});
  }

  // Outputs and gradients.
  auto y_bad = env.output({8, 5}, f);
  expect_error([&] { ops::grouped_linear_forward(x, w, offsets, y_bad, false, s); }, {fwd, "y"});
  expect_error([&] { ops::grouped_linear_backward(x, w, offsets, y_bad, dx, false, dw, s); },
               {bwd, "dy"});
  auto dx_bad = env.output({8, 5}, f);
  expect_error([&] { ops::grouped_linear_backward(x, w, offsets, dy, dx_bad, false, dw, s); },
               {bwd, "dx"});
  expect_error(
      [&] {
        ops::grouped_linear_backward(x, w, offsets, dy, dx, false, std::span(dw).first(2), s);
      },
      {bwd, "one per group (3), got 2"});
  std::vector<Tensor> dw_bad = dw;
  dw_bad[2] = w_bad_n;
  expect_error([&] { ops::grouped_linear_backward(x, w, offsets, dy, dx, false, dw_bad, s); },
               {bwd, "group 2", "dw"});
  // dw: x's dtype, or f32 for a bf16 x (the fp32 main gradient) only.
  auto dw_f32 = weights(env, DType::f32, p, in.dw0);
  expect_error(
      [&] { ops::grouped_linear_backward(x, w, offsets, dy, dx, false, views(dw_f32), s); },
      {bwd, "group 0", "dw", "f64"});
  // A CPU op rejects storage it has no loop for, even with every group empty.
  auto x_i32 =
      OwnedTensor::device(env.backend(), Shape{0, 4}, DType::i32, LiveSet::workspace, "i32 x");
  auto w_i32 =
      OwnedTensor::device(env.backend(), Shape{6, 4}, DType::i32, LiveSet::workspace, "i32 w");
  auto y_i32 =
      OwnedTensor::device(env.backend(), Shape{0, 6}, DType::i32, LiveSet::workspace, "i32 y");
  expect_error(
      [&] {
        ops::grouped_linear_forward(x_i32, std::vector<Tensor>{w_i32.view()},
                                    std::vector<int64_t>{0, 0}, y_i32, false, s);
      },
      {fwd, "i32"});

  // Nothing was enqueued by the failed calls: y is still all NaN.
  for (double v : env.read(y)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace moepeak
