// test_backend_ops cases: gather_rows, scatter_add_rows, combine_rows, combine_rows_backward
// (ops/permute.h).
//
// Indices are random tokens (many repeats, some tokens never hit) and, in the "routed" cases,
// the expert-major layout of the standard schedule (each token k times, experts one after
// another). Shapes reach the CUDA scatter's corners: M = 0, N = 1 (one destination row, the M
// additions serialised, columns split over blocks), M > 256 (several index chunks per block), N
// larger than the grid (several rows per block), H = 1. combine_rows_backward also runs with
// dy = y (in place). On CUDA an index outside [0, N) is skipped (ops/permute.h: nothing added,
// zeros written) where the CPU throws; the "skip rule" cases feed such indices to the GPU and
// compute the documented result on the host for the reference.
#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/cpu_storage.h"
#include "ops/op_common.h"
#include "ops/permute.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

// M = N * k routed rows in expert-major order: each token picks k distinct experts of E, then
// the rows are listed expert by expert, tokens ascending within an expert.
Generator routed_index(int64_t tokens, int64_t experts, int64_t k) {
  return [tokens, experts, k](std::mt19937_64& rng, int64_t n) {
    MOEPEAK_CHECK(n == tokens * k, "routed_index: ", n, " != ", tokens, " * ", k);
    std::vector<std::vector<double>> by_expert(static_cast<size_t>(experts));
    std::vector<int64_t> perm(static_cast<size_t>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < k; ++j) by_expert[perm[j]].push_back(static_cast<double>(t));
    }
    std::vector<double> v;
    for (auto& rows : by_expert) v.insert(v.end(), rows.begin(), rows.end());
    return v;
  };
}

// Integers in [0, rows), about one in five replaced by -1, rows, or a large id.
Generator index_with_invalid(int64_t rows) {
  return [rows](std::mt19937_64& rng, int64_t n) {
    std::uniform_int_distribution<int64_t> token(0, rows - 1);
    std::uniform_int_distribution<int> pick(0, 14);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      int p = pick(rng);
      x = p == 0 ? -1.0 : p == 1 ? static_cast<double>(rows) : p == 2 ? 1e9 : double(token(rng));
    }
    return v;
  };
}

bool valid(int32_t r, int64_t rows) { return r >= 0 && r < rows; }

// The CUDA rule for an index outside [0, N) (ops/permute.h), on host memory of the CPU backend:
// in f64 for the reference, and in the storage dtype when the CPU is under test (bf16 with fp32
// arithmetic, ops/cpu/cpu_storage.h; the sums of combine_skip_rule are kept in fp32 and rounded
// once, since a row here takes a dozen additions and bf16 rounding at each would drift past the
// 1e-2 tolerance: only the f64 run of this host rule matters, as CUDA's reference).
void gather_skip_rule(const Tensor& src, const Tensor& index, const Tensor& dst) {
  ops::dispatch_storage(dst.dtype(), "gather_rows skip rule", [&](auto zero) {
    using T = decltype(zero);
    using C = ops::compute_t<T>;
    const int64_t rows = src.size(0), hidden = src.size(1);
    const int32_t* ip = index.data_as<int32_t>();
    for (int64_t i = 0; i < index.size(0); ++i) {
      for (int64_t h = 0; h < hidden; ++h) {
        ops::store(dst.data_as<T>() + i * hidden + h,
                   valid(ip[i], rows) ? ops::load(src.data_as<T>()[ip[i] * hidden + h]) : C(0));
      }
    }
  });
}

void combine_skip_rule(const Tensor& y, const Tensor& index, const Tensor* weight,
                       const Tensor& out) {
  ops::dispatch_storage(out.dtype(), "combine_rows skip rule", [&](auto zero) {
    using T = decltype(zero);
    using C = ops::compute_t<T>;
    const int64_t rows = out.size(0), hidden = out.size(1);
    const int32_t* ip = index.data_as<int32_t>();
    std::vector<C> acc(static_cast<size_t>(out.numel()));
    ops::widen(out.data_as<T>(), acc.data(), out.numel());
    for (int64_t i = 0; i < index.size(0); ++i) {
      if (!valid(ip[i], rows)) continue;
      C w = weight != nullptr ? ops::load(weight->data_as<T>()[i]) : C(1);
      for (int64_t h = 0; h < hidden; ++h) {
        acc[ip[i] * hidden + h] += w * ops::load(y.data_as<T>()[i * hidden + h]);
      }
    }
    ops::narrow(acc.data(), out.data_as<T>(), out.numel());
  });
}

void combine_backward_skip_rule(const Tensor& dout, const Tensor& y, const Tensor& index,
                                const Tensor& weight, const Tensor& dy, const Tensor& dweight) {
  ops::dispatch_storage(dout.dtype(), "combine_rows_backward skip rule", [&](auto zero) {
    using T = decltype(zero);
    using C = ops::compute_t<T>;
    const int64_t rows = dout.size(0), hidden = dout.size(1);
    const int32_t* ip = index.data_as<int32_t>();
    for (int64_t i = 0; i < index.size(0); ++i) {
      double dot = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        C g = valid(ip[i], rows) ? ops::load(dout.data_as<T>()[ip[i] * hidden + h]) : C(0);
        dot += double(g) * ops::load(y.data_as<T>()[i * hidden + h]);
        ops::store(dy.data_as<T>() + i * hidden + h, ops::load(weight.data_as<T>()[i]) * g);
      }
      ops::store(dweight.data_as<T>() + i, static_cast<C>(dot));
    }
  });
}

struct PermuteShape {
  std::string name;
  int64_t n, m, h;
  Generator index;
};

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(permute) {
  std::vector<OpCase> cases;
  auto random_tokens = [](int64_t n) { return integers(0, n - 1); };
  const std::vector<PermuteShape> shapes{
      {"", 16, 40, 33, random_tokens(16)},
      {"", 5, 3, 1, random_tokens(5)},
      {"", 7, 0, 8, random_tokens(7)},
      {"", 1, 700, 300, random_tokens(1)},
      {"", 3000, 2500, 24, random_tokens(3000)},
      {"", 300, 1000, 96, random_tokens(300)},
      {" routed", 200, 200 * 4, 64, routed_index(200, 8, 4)},
      {" routed", 1000, 1000 * 2, 40, routed_index(1000, 16, 2)},
  };
  for (const auto& sh : shapes) {
    const int64_t n = sh.n, m = sh.m, h = sh.h;
    std::string shape =
        sh.name + " N=" + std::to_string(n) + " M=" + std::to_string(m) + " H=" + std::to_string(h);
    cases.push_back(OpCase{
        "gather_rows" + shape,
        {in("src", {n, h}), in("index", {m}, Kind::i32, sh.index), out("dst", {m, h})},
        [](const std::vector<Tensor>& t, Stream& s) { ops::gather_rows(t[0], t[1], t[2], s); }});
    cases.push_back(
        OpCase{"scatter_add_rows" + shape,
               {in("src", {m, h}), in("index", {m}, Kind::i32, sh.index), inout("dst", {n, h})},
               [](const std::vector<Tensor>& t, Stream& s) {
                 ops::scatter_add_rows(t[0], t[1], t[2], s);
               }});
    cases.push_back(OpCase{"combine_rows" + shape,
                           {in("y", {m, h}), in("index", {m}, Kind::i32, sh.index),
                            in("weight", {m}), inout("out", {n, h})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::combine_rows(t[0], t[1], t[2], t[3], s);
                           }});
    cases.push_back(
        OpCase{"combine_rows_backward" + shape,
               {in("dout", {n, h}), in("y", {m, h}), in("index", {m}, Kind::i32, sh.index),
                in("weight", {m}), out("dy", {m, h}), out("dweight", {m})},
               [](const std::vector<Tensor>& t, Stream& s) {
                 ops::combine_rows_backward(t[0], t[1], t[2], t[3], t[4], t[5], s);
               }});
    cases.push_back(
        OpCase{"combine_rows_backward in place" + shape,
               {in("dout", {n, h}), inout("y", {m, h}), in("index", {m}, Kind::i32, sh.index),
                in("weight", {m}), out("dweight", {m})},
               [](const std::vector<Tensor>& t, Stream& s) {
                 ops::combine_rows_backward(t[0], t[1], t[2], t[3], t[1], t[4], s);
               }});
  }

  // Indices outside [0, N): CUDA skips them (ops/permute.h); the CPU reference applies the same
  // rule on the host, since the CPU ops throw on them.
  for (auto [n, m, h] : std::vector<std::array<int64_t, 3>>{{16, 60, 33}, {50, 700, 8}}) {
    std::string shape =
        " N=" + std::to_string(n) + " M=" + std::to_string(m) + " H=" + std::to_string(h);
    cases.push_back(OpCase{
        "gather_rows skip rule" + shape,
        {in("src", {n, h}), in("index", {m}, Kind::i32, index_with_invalid(n)), out("dst", {m, h})},
        [](const std::vector<Tensor>& t, Stream& s) {
          if (ops::runs_on_cuda(t[2])) {
            ops::gather_rows(t[0], t[1], t[2], s);
          } else {
            gather_skip_rule(t[0], t[1], t[2]);
          }
        }});
    cases.push_back(OpCase{"scatter_add_rows skip rule" + shape,
                           {in("src", {m, h}), in("index", {m}, Kind::i32, index_with_invalid(n)),
                            inout("dst", {n, h})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             if (ops::runs_on_cuda(t[2])) {
                               ops::scatter_add_rows(t[0], t[1], t[2], s);
                             } else {
                               combine_skip_rule(t[0], t[1], nullptr, t[2]);
                             }
                           }});
    cases.push_back(OpCase{"combine_rows skip rule" + shape,
                           {in("y", {m, h}), in("index", {m}, Kind::i32, index_with_invalid(n)),
                            in("weight", {m}), inout("out", {n, h})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             if (ops::runs_on_cuda(t[3])) {
                               ops::combine_rows(t[0], t[1], t[2], t[3], s);
                             } else {
                               combine_skip_rule(t[0], t[1], &t[2], t[3]);
                             }
                           }});
    cases.push_back(OpCase{
        "combine_rows_backward skip rule" + shape,
        {in("dout", {n, h}), in("y", {m, h}), in("index", {m}, Kind::i32, index_with_invalid(n)),
         in("weight", {m}), out("dy", {m, h}), out("dweight", {m})},
        [](const std::vector<Tensor>& t, Stream& s) {
          if (ops::runs_on_cuda(t[4])) {
            ops::combine_rows_backward(t[0], t[1], t[2], t[3], t[4], t[5], s);
          } else {
            combine_backward_skip_rule(t[0], t[1], t[2], t[3], t[4], t[5]);
          }
        }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
