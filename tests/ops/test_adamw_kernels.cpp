// The AdamW kernels against the reference — ops/adamw.h's update as a plain scalar loop, kept
// here — bitwise:
//   - ops::adamw_cpu (the resident update on the CPU backend), f32 and f64;
//   - adamw_span, scalar and AVX2 paths, f32 and f64, every tail length 0..40 and a long span,
//     random inputs (never zeros) and random hyper-parameters, decay on and off;
//   - adamw_fused_cpu (the device stage of OffloadStreamAdamW): master, m, v as adamw_cpu, and
//     the working weights equal to the new master; with bf16 working weights and gradient,
//     master, m, v as adamw_cpu in f32 on the widened gradient and the working weights the new
//     master rounded to nearest even; with bf16 working weights and an f32 gradient (the fp32
//     main gradient), the same on that gradient as it is; argument errors;
//   - WorkerPool: every task exactly once, on 1..4 threads, errors propagated, reused;
//   - CpuAdamW (serial offload's host AdamW): segments with gaps on 1, 2 and 4 threads, each
//     segment bitwise adamw_cpu's, the gaps untouched; with bf16 working weights, each segment's
//     new master rounded to nearest even (f32 only: refused beside an f64 master).
// Outputs the kernels must overwrite are compared in full, so an unwritten element fails.
// Run: ctest -R test_adamw_kernels --output-on-failure
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/adamw.h"
#include "ops/adamw_fused.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/cpu/cpu_adamw.h"
#include "ops/cpu/worker_pool.h"

namespace moepeak {
namespace {

template <typename T>
struct Inputs {
  std::vector<T> p, g, m, v;
};

template <typename T>
Inputs<T> random_inputs(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> pos(1e-6, 2.0);
  Inputs<T> in;
  for (int64_t i = 0; i < n; ++i) {
    in.p.push_back(static_cast<T>(normal(rng)));
    in.g.push_back(static_cast<T>(0.1 * normal(rng)));
    in.m.push_back(static_cast<T>(0.05 * normal(rng)));
    in.v.push_back(static_cast<T>(0.01 * pos(rng)));  // a second moment is never negative
  }
  return in;
}

ops::AdamWHyper random_hyper(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  ops::AdamWHyper h;
  h.lr = 1e-4 + 1e-2 * u(rng);
  h.beta1 = 0.8 + 0.19 * u(rng);
  h.beta2 = 0.9 + 0.0999 * u(rng);
  h.eps = u(rng) < 0.5 ? 1e-8 : 1e-6;
  h.weight_decay = 0.3 * u(rng);
  h.step = 1 + static_cast<int64_t>(u(rng) * 50);
  h.grad_scale = u(rng) < 0.5 ? 1.0 : 0.1 + 0.9 * u(rng);
  return h;
}

template <typename T>
DType dtype_for() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

// The reference every placement is held to: ops/adamw.h's update as a plain scalar loop, one
// IEEE operation per arithmetic sign in T, the scalars computed in double and rounded to T (what
// torch.optim.AdamW does element by element), on copies of `in`.
template <typename T>
Inputs<T> reference(const Inputs<T>& in, const ops::AdamWHyper& h, bool decay) {
  Inputs<T> out = in;
  const T beta1 = static_cast<T>(h.beta1), beta2 = static_cast<T>(h.beta2);
  const T one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
  const T one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
  const T grad_scale = static_cast<T>(h.grad_scale);
  const T decay_factor = static_cast<T>(decay ? 1.0 - h.lr * h.weight_decay : 1.0);
  const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const T step_size = static_cast<T>(h.lr / bias1);
  const T bias2_sqrt = static_cast<T>(std::sqrt(bias2));
  const T eps = static_cast<T>(h.eps);
  for (size_t i = 0; i < out.p.size(); ++i) {
    const T g = out.g[i] * grad_scale;
    out.m[i] = beta1 * out.m[i] + one_minus_beta1 * g;
    out.v[i] = beta2 * out.v[i] + one_minus_beta2 * g * g;
    out.p[i] *= decay_factor;
    const T denom = std::sqrt(out.v[i]) / bias2_sqrt + eps;
    out.p[i] -= step_size * (out.m[i] / denom);
  }
  return out;
}

template <typename T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  if (got.empty()) return;  // memcmp of an empty vector's null data() is undefined (UBSan)
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << what << " differs";
}

std::vector<ops::AdamWSimd> paths() {
  std::vector<ops::AdamWSimd> p = {ops::AdamWSimd::scalar, ops::AdamWSimd::automatic};
  if (ops::adamw_avx2_available()) p.push_back(ops::AdamWSimd::avx2);
  return p;
}

template <typename T>
void span_matches_reference() {
  std::mt19937_64 rng(7);
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 40; ++n) sizes.push_back(n);
  sizes.push_back(10007);
  for (ops::AdamWSimd simd : paths()) {
    for (int64_t n : sizes) {
      for (bool decay : {true, false}) {
        const Inputs<T> in = random_inputs<T>(n, rng);
        const ops::AdamWHyper h = random_hyper(rng);
        const Inputs<T> want = reference(in, h, decay);
        Inputs<T> got = in;
        std::vector<T> working(static_cast<size_t>(n), static_cast<T>(NAN));
        ops::adamw_span<T>(got.p.data(), got.g.data(), got.m.data(), got.v.data(), working.data(),
                           n, ops::AdamWScalars<T>::make(h, decay), simd);
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " decay " << decay << " simd " << static_cast<int>(simd));
        expect_bitwise(got.p, want.p, "param");
        expect_bitwise(got.m, want.m, "m");
        expect_bitwise(got.v, want.v, "v");
        expect_bitwise(working, want.p, "working weights");
      }
    }
  }
}

TEST(AdamWSpan, EveryPathIsBitwiseTheReferenceF32) { span_matches_reference<float>(); }
TEST(AdamWSpan, EveryPathIsBitwiseTheReferenceF64) { span_matches_reference<double>(); }

// ops::adamw_cpu, the resident update on the CPU backend (adamw_span on the stream's worker).
template <typename T>
void op_matches_reference() {
  auto backend = Backend::create(BackendOptions{});
  std::mt19937_64 rng(23);
  for (int64_t n : {0, 1, 7, 8, 9, 4099}) {
    for (bool decay : {true, false}) {
      const Inputs<T> in = random_inputs<T>(n, rng);
      const ops::AdamWHyper h = random_hyper(rng);
      const Inputs<T> want = reference(in, h, decay);
      Inputs<T> got = in;
      auto t = [&](std::vector<T>& x) {
        return Tensor(x.data(), Shape{n}, dtype_for<T>(), Placement::device, backend.get());
      };
      ops::adamw_cpu(t(got.p), t(got.g), t(got.m), t(got.v), h, decay, backend->default_stream());
      backend->default_stream().synchronize();
      SCOPED_TRACE(testing::Message() << "n " << n << " decay " << decay);
      expect_bitwise(got.p, want.p, "param");
      expect_bitwise(got.m, want.m, "m");
      expect_bitwise(got.v, want.v, "v");
    }
  }
}

TEST(AdamWOp, IsBitwiseTheReferenceF32) { op_matches_reference<float>(); }
TEST(AdamWOp, IsBitwiseTheReferenceF64) { op_matches_reference<double>(); }

TEST(AdamWSpan, ReportsTheAvx2PathOnThisMachine) {
  // Informational: the CI machine (AMD EPYC) has AVX2, so the vector path is what runs there.
  std::printf("AVX2 path available: %s\n", ops::adamw_avx2_available() ? "yes" : "no");
  if (!ops::adamw_avx2_available()) {
    std::vector<float> x(1, 1.0f);
    EXPECT_THROW(
        ops::adamw_span<float>(x.data(), x.data(), x.data(), x.data(), nullptr, 1,
                               ops::AdamWScalars<float>::make({}, true), ops::AdamWSimd::avx2),
        Error);
  }
}

template <typename T>
void fused_matches_reference() {
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::mt19937_64 rng(11);
  const DType dt = dtype_for<T>();
  for (int64_t n : {1, 9, 4099}) {
    for (bool decay : {true, false}) {
      const Inputs<T> in = random_inputs<T>(n, rng);
      const ops::AdamWHyper h = random_hyper(rng);
      const Inputs<T> want = reference(in, h, decay);
      Inputs<T> got = in;
      std::vector<T> working(static_cast<size_t>(n), static_cast<T>(NAN));
      auto t = [&](std::vector<T>& x) {
        return Tensor(x.data(), Shape{n}, dt, Placement::device, backend.get());
      };
      ops::adamw_fused_cpu(t(got.p), t(got.g), t(got.m), t(got.v), t(working), h, decay, stream);
      stream.synchronize();
      expect_bitwise(got.p, want.p, "master");
      expect_bitwise(got.m, want.m, "m");
      expect_bitwise(got.v, want.v, "v");
      expect_bitwise(working, want.p, "working weights");
    }
  }
}

TEST(AdamWFused, MasterMomentsAndWorkingWeightsAreBitwiseTheReferenceF32) {
  fused_matches_reference<float>();
}
TEST(AdamWFused, MasterMomentsAndWorkingWeightsAreBitwiseTheReferenceF64) {
  fused_matches_reference<double>();
}

// adamw_fused_cpu with bf16 working weights on the f32 master, m and v of `in` and the gradient
// `grad` (in.g stored as `grad_dtype`, bf16 or f32): master, m and v bitwise the f32 reference
// on in.g, the working weights that new master rounded to bf16.
void expect_fused_bf16_is_the_f32_update(Backend& backend, const Inputs<float>& in, void* grad,
                                         DType grad_dtype, const ops::AdamWHyper& h, bool decay) {
  const int64_t n = static_cast<int64_t>(in.p.size());
  const Inputs<float> want = reference(in, h, decay);
  Inputs<float> got = in;
  std::vector<bf16> working(static_cast<size_t>(n), bf16(NAN));
  auto t = [&](void* data, DType dtype) {
    return Tensor(data, Shape{n}, dtype, Placement::device, &backend);
  };
  Stream& stream = backend.default_stream();
  ops::adamw_fused_cpu(t(got.p.data(), DType::f32), t(grad, grad_dtype),
                       t(got.m.data(), DType::f32), t(got.v.data(), DType::f32),
                       t(working.data(), DType::bf16), h, decay, stream);
  stream.synchronize();
  SCOPED_TRACE(testing::Message() << "n " << n << " decay " << decay);
  expect_bitwise(got.p, want.p, "master");
  expect_bitwise(got.m, want.m, "m");
  expect_bitwise(got.v, want.v, "v");
  int64_t differ = 0;
  for (size_t i = 0; i < working.size(); ++i)
    differ += working[i].bits != bf16(want.p[i]).bits ? 1 : 0;
  EXPECT_EQ(differ, 0) << "working weights other than the new master rounded to bf16";
}

TEST(AdamWFused, Bf16WorkingWeightsAreTheF32UpdateOfTheWidenedGradient) {
  // The gradient drawn in f32 and rounded to bf16; the reference is the f32 loop on that
  // gradient widened. n crosses the kernel's 2048-element chunks and leaves every AVX2 tail.
  auto backend = Backend::create(BackendOptions{});
  std::mt19937_64 rng(17);
  for (int64_t n : {1, 9, 2047, 2048, 2049, 4099, 10007}) {
    for (bool decay : {true, false}) {
      Inputs<float> in = random_inputs<float>(n, rng);
      std::vector<bf16> grad(static_cast<size_t>(n));
      for (size_t i = 0; i < grad.size(); ++i) {
        grad[i] = bf16(in.g[i]);
        in.g[i] = static_cast<float>(grad[i]);
      }
      const ops::AdamWHyper h = random_hyper(rng);
      expect_fused_bf16_is_the_f32_update(*backend, in, grad.data(), DType::bf16, h, decay);
    }
  }
}

TEST(AdamWFused, Bf16WorkingWeightsWithAnF32GradientAreTheF32UpdateOfThatGradient) {
  // The fp32 main gradient: f32 values with no bf16 rounding, read as they are; the reference is
  // the f32 loop on that gradient. n crosses the kernel's 2048-element chunks and leaves every
  // AVX2 tail.
  auto backend = Backend::create(BackendOptions{});
  std::mt19937_64 rng(19);
  for (int64_t n : {1, 9, 2047, 2048, 2049, 4099, 10007}) {
    for (bool decay : {true, false}) {
      const Inputs<float> in = random_inputs<float>(n, rng);
      const ops::AdamWHyper h = random_hyper(rng);
      std::vector<float> grad = in.g;
      expect_fused_bf16_is_the_f32_update(*backend, in, grad.data(), DType::f32, h, decay);
      expect_bitwise(grad, in.g, "gradient (read only)");
    }
  }
}

TEST(AdamWFused, RejectsMismatchedArguments) {
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::vector<float> a(8, 1.0f), b(7, 1.0f);
  std::vector<double> wide(8, 1.0);
  std::vector<uint16_t> half(8);
  Tensor t8(a.data(), Shape{8}, DType::f32, Placement::device, backend.get());
  Tensor t7(b.data(), Shape{7}, DType::f32, Placement::device, backend.get());
  Tensor d8(wide.data(), Shape{8}, DType::f64, Placement::device, backend.get());
  Tensor bf(half.data(), Shape{8}, DType::bf16, Placement::device, backend.get());
  ops::AdamWHyper h;
  EXPECT_THROW(ops::adamw_fused_cpu(t8, t7, t8, t8, t8, h, true, stream), Error);
  // bf16 working weights take a bf16 or f32 gradient and an f32 master; f32 working weights an
  // f32 gradient.
  auto expect_error = [&](const Tensor& master, const Tensor& grad, const Tensor& moments,
                          const Tensor& working, const char* fragment) {
    try {
      ops::adamw_fused_cpu(master, grad, moments, moments, working, h, true, stream);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(t8, d8, t8, bf, "the gradient takes the working weights' dtype, or f32");
  expect_error(t8, bf, t8, t8, "the gradient takes the working weights' dtype, or f32");
  expect_error(d8, bf, d8, bf, "bf16 working weights of an f32 master; got master f64");
  h.step = 0;
  EXPECT_THROW(ops::adamw_fused_cpu(t8, t8, t8, t8, t8, h, true, stream), Error);
  stream.synchronize();
}

TEST(WorkerPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ops::WorkerPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int round = 0; round < 20; ++round) {  // reused many times
      const int64_t tasks = 1 + round * 37;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
      pool.run(tasks, [&](int64_t t) { hits[static_cast<size_t>(t)].fetch_add(1); });
      for (int64_t t = 0; t < tasks; ++t) ASSERT_EQ(hits[static_cast<size_t>(t)].load(), 1) << t;
    }
    pool.run(0, [](int64_t) { FAIL() << "no task to run"; });
  }
}

TEST(WorkerPool, RethrowsTheFirstErrorAndStaysUsable) {
  ops::WorkerPool pool(3);
  EXPECT_THROW(pool.run(100,
                        [](int64_t t) {
                          if (t == 42) throw std::runtime_error("task 42");
                        }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.run(10, [&](int64_t t) { sum += t; });
  EXPECT_EQ(sum.load(), 45);
}

template <typename T>
void cpu_adamw_matches_reference() {
  std::mt19937_64 rng(13);
  // Three segments with gaps (as pieces with alignment padding) and one longer than a few tiles.
  const std::vector<ops::CpuAdamW::Segment> segments = {
      {3, 100, true},
      {128, 5 * ops::CpuAdamW::kTileElements + 17, false},
      {128 + 5 * 16384 + 64, 999, true}};
  const int64_t n = segments.back().offset + segments.back().length + 5;
  const Inputs<T> in = random_inputs<T>(n, rng);
  const ops::AdamWHyper h = random_hyper(rng);
  // The reference on each segment; elements outside stay as they were.
  Inputs<T> want = in;
  for (const auto& s : segments) {
    Inputs<T> part;
    auto cut = [&](const std::vector<T>& x) {
      return std::vector<T>(x.begin() + s.offset, x.begin() + s.offset + s.length);
    };
    part = {cut(in.p), cut(in.g), cut(in.m), cut(in.v)};
    Inputs<T> done = reference(part, h, s.decay);
    std::copy(done.p.begin(), done.p.end(), want.p.begin() + s.offset);
    std::copy(done.m.begin(), done.m.end(), want.m.begin() + s.offset);
    std::copy(done.v.begin(), done.v.end(), want.v.begin() + s.offset);
  }
  for (int threads : {1, 2, 4}) {
    for (ops::AdamWSimd simd : paths()) {
      ops::CpuAdamW adam(threads, simd);
      Inputs<T> got = in;
      adam.step<T>(got.p.data(), got.g.data(), got.m.data(), got.v.data(), segments, h);
      SCOPED_TRACE(testing::Message() << threads << " threads, simd " << static_cast<int>(simd));
      expect_bitwise(got.p, want.p, "master");
      expect_bitwise(got.m, want.m, "m");
      expect_bitwise(got.v, want.v, "v");
      expect_bitwise(got.g, in.g, "grad (read only)");
      // With bf16 working weights (the serial offload of a bf16 run): the same master, m and v,
      // and each segment's new master rounded to nearest even as adamw_fused writes it; the
      // gaps keep what they held.
      Inputs<T> with_working = in;
      const bf16 sentinel = bf16(12345.0f);
      std::vector<bf16> working(static_cast<size_t>(n), sentinel);
      if constexpr (std::is_same_v<T, float>) {
        adam.step<T>(with_working.p.data(), with_working.g.data(), with_working.m.data(),
                     with_working.v.data(), segments, h, working.data());
        expect_bitwise(with_working.p, want.p, "master (with bf16 working weights)");
        expect_bitwise(with_working.m, want.m, "m (with bf16 working weights)");
        expect_bitwise(with_working.v, want.v, "v (with bf16 working weights)");
        std::vector<bool> inside(static_cast<size_t>(n), false);
        for (const auto& seg : segments) {
          for (int64_t i = seg.offset; i < seg.offset + seg.length; ++i) inside[i] = true;
        }
        int64_t wrong = 0;
        for (size_t i = 0; i < working.size(); ++i) {
          const uint16_t expect = inside[i] ? bf16(want.p[i]).bits : sentinel.bits;
          wrong += working[i].bits != expect ? 1 : 0;
        }
        EXPECT_EQ(wrong, 0) << "bf16 working weights other than the new master rounded, or a "
                               "gap written";
      } else {
        EXPECT_THROW(
            adam.step<T>(with_working.p.data(), with_working.g.data(), with_working.m.data(),
                         with_working.v.data(), segments, h, working.data()),
            Error)
            << "bf16 working weights beside an f64 master";
      }
    }
  }
}

TEST(CpuAdamW, SegmentsAreBitwiseTheReferenceOnAnyThreadCountF32) {
  cpu_adamw_matches_reference<float>();
}
TEST(CpuAdamW, SegmentsAreBitwiseTheReferenceOnAnyThreadCountF64) {
  cpu_adamw_matches_reference<double>();
}

}  // namespace
}  // namespace moepeak
