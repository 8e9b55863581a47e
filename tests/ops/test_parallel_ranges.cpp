// The CPU ops' row- and element-parallel loops (ops/cpu/parallel_ranges.h): every index exactly
// once in ranges cut at multiples of the grain, exceptions rethrown, and the ops that use them
// (the SwiGLU, plain and clamped, the cross-entropy, the resident AdamW, the attention forward and
// backward over (batch, kv head) pairs) bitwise the same on 1, 2 and 3 threads, f32 and f64 (and
// bf16 for the attention's two-pass backward), at sizes that split. Run: ctest -R
// test_parallel_ranges
#include <cblas.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cpu/parallel_ranges.h"
#include "ops/cross_entropy.h"
#include "ops/swiglu.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::OpEnv;

// Sets OpenBLAS's threads (which parallel_ranges follows) for the scope.
struct Threads {
  int before = openblas_get_num_threads();
  explicit Threads(int n) { openblas_set_num_threads(n); }
  ~Threads() { openblas_set_num_threads(before); }
};

TEST(ParallelRanges, EveryIndexOnceInRangesCutAtTheGrain) {
  Threads three(3);
  EXPECT_EQ(ops::cpu_op_threads(), 3);
  for (int64_t n : {0, 1, 63, 64, 127, 128, 1000, 4096 + 17}) {
    for (int64_t grain : {1, 8, 64}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      ops::parallel_ranges(n, grain, [&](int64_t begin, int64_t end) {
        EXPECT_LT(begin, end);
        EXPECT_EQ(begin % grain, 0) << "a range starts at a multiple of the grain";
        for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << n << " " << i;
    }
  }
  EXPECT_THROW(ops::parallel_ranges(1000, 8,
                                    [](int64_t begin, int64_t) {
                                      if (begin > 0) throw std::runtime_error("range");
                                    }),
               std::runtime_error);
}

std::vector<double> random_values(size_t n, uint64_t seed, double lo, double hi) {
  std::vector<double> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (double& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = lo + (hi - lo) * static_cast<double>(x >> 11) / 9007199254740992.0;
  }
  return v;
}

// Every output of the SwiGLU (plain and clamped) and the cross-entropy, forward and backward,
// and of an AdamW update, at `threads`, as doubles.
std::vector<double> run_ops(int threads, DType dtype) {
  Threads t(threads);
  OpEnv env;
  std::vector<double> all;
  auto append = [&](const Tensor& x) {
    const std::vector<double> v = env.read(x);
    all.insert(all.end(), v.begin(), v.end());
  };
  const int64_t M = 83, F = 1000;  // 83,000 elements: five ranges of 16,384 and a tail
  const size_t n = static_cast<size_t>(M * F);
  auto a = env.input({M, F}, dtype, random_values(n, 1, -9.0, 9.0));
  auto b = env.input({M, F}, dtype, random_values(n, 2, -9.0, 9.0));
  auto dh = env.input({M, F}, dtype, random_values(n, 3, -1.5, 1.3));
  for (const ops::SwigluParams& p : {ops::SwigluParams{}, ops::SwigluParams::gpt_oss()}) {
    auto h = env.output({M, F}, dtype), da = env.output({M, F}, dtype),
         db = env.output({M, F}, dtype);
    ops::swiglu_forward_cpu(a, b, p, h, env.stream());
    ops::swiglu_backward_cpu(a, b, dh, p, da, db, env.stream());
    append(h), append(da), append(db);
  }
  const int64_t N = 700, V = 300;  // 218 rows a range
  auto logits = env.input({N, V}, dtype, random_values(static_cast<size_t>(N * V), 4, -6.0, 7.5));
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[static_cast<size_t>(i)] = i % 11 == 3 ? -100 : i * 37 % V;
  auto label_t = env.indices({N}, DType::i64, labels);
  auto losses = env.output({N}, dtype), dlogits = env.output({N, V}, dtype);
  ops::cross_entropy_forward_cpu(logits, label_t, losses, env.stream());
  ops::cross_entropy_backward_cpu(logits, label_t, 1.0 / 640, dlogits, env.stream());
  append(losses), append(dlogits);
  // AdamW: 300,001 elements, four ranges of 65,536 and a tail that is no multiple of 8.
  const int64_t P = 300001;
  auto param = env.input({P}, dtype, random_values(static_cast<size_t>(P), 5, -2.0, 2.0));
  auto grad = env.input({P}, dtype, random_values(static_cast<size_t>(P), 6, -0.5, 0.4));
  auto m = env.input({P}, dtype, random_values(static_cast<size_t>(P), 7, -0.1, 0.1));
  auto v = env.input({P}, dtype, random_values(static_cast<size_t>(P), 8, 0.001, 0.02));
  ops::AdamWHyper hyper;
  hyper.lr = 3e-3, hyper.weight_decay = 0.1, hyper.step = 7;
  ops::adamw_cpu(param, grad, m, v, hyper, /*decay=*/true, env.stream());
  append(param), append(m), append(v);
  return all;
}

TEST(ParallelRanges, OpsAreBitwiseTheSameOnAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const std::vector<double> one = run_ops(1, dtype);
    for (double v : one) ASSERT_TRUE(std::isfinite(v)) << "every output written";
    for (int threads : {2, 3}) {
      const std::vector<double> many = run_ops(threads, dtype);
      ASSERT_EQ(many.size(), one.size());
      EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(double)), 0)
          << threads << " threads, " << dtype_name(dtype);
    }
  }
}

// The attention's outputs (out, lse, dq, dk, dv, dsinks) at `threads`: B 3, T 150, 4 query heads
// over 2 kv heads (6 pairs), sinks, with and without a window of 40.
std::vector<double> run_attention(int threads, DType dtype) {
  Threads t(threads);
  OpEnv env;
  std::vector<double> all;
  const int64_t B = 3, T = 150, nh = 4, nkv = 2, dqk = 32, dv = 24;
  const DType lse_dtype = ops::attention_lse_dtype(dtype);
  auto input = [&](Shape shape, uint64_t seed) {
    return testing::make_input(env, shape, dtype,
                               random_values(static_cast<size_t>(shape.numel()), seed, -1.2, 1.3));
  };
  auto q = input({B, T, nh, dqk}, 11), k = input({B, T, nkv, dqk}, 12),
       v = input({B, T, nkv, dv}, 13), dout = input({B, T, nh, dv}, 14), sinks = input({nh}, 15);
  for (int64_t window : {0, 40}) {
    ops::AttentionVariant variant;
    variant.window = window;
    variant.sinks = sinks;
    OwnedTensor out_t =
        OwnedTensor::device(env.backend(), Shape{B, T, nh, dv}, dtype, LiveSet::workspace, "out");
    OwnedTensor lse =
        OwnedTensor::device(env.backend(), Shape{B, nh, T}, lse_dtype, LiveSet::workspace, "lse");
    OwnedTensor dq =
        OwnedTensor::device(env.backend(), Shape{B, T, nh, dqk}, dtype, LiveSet::workspace, "dq");
    OwnedTensor dk =
        OwnedTensor::device(env.backend(), Shape{B, T, nkv, dqk}, dtype, LiveSet::workspace, "dk");
    OwnedTensor dvt =
        OwnedTensor::device(env.backend(), Shape{B, T, nkv, dv}, dtype, LiveSet::workspace, "dv");
    auto dsinks = env.input({nh}, lse_dtype, std::vector<double>(nh, 0.0));
    const double scale = 1.0 / std::sqrt(static_cast<double>(dqk));
    ops::attention_forward_cpu(q, k, v, scale, variant, out_t, lse, env.stream());
    ops::attention_backward_cpu(q, k, v, out_t, lse, dout, scale, variant, dq, dk, dvt, dsinks,
                                env.stream());
    for (const Tensor* x :
         {&out_t.view(), &lse.view(), &dq.view(), &dk.view(), &dvt.view(), &dsinks.view()}) {
      const std::vector<double> values = env.read(*x);
      all.insert(all.end(), values.begin(), values.end());
    }
  }
  return all;
}

TEST(ParallelRanges, AttentionIsBitwiseTheSameOnAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    const std::vector<double> one = run_attention(1, dtype);
    for (double v : one) ASSERT_TRUE(std::isfinite(v)) << "every output written";
    for (int threads : {2, 3}) {
      const std::vector<double> many = run_attention(threads, dtype);
      ASSERT_EQ(many.size(), one.size());
      EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(double)), 0)
          << threads << " threads, " << dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace moepeak
