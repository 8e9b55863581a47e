// The harness of test_backend_ops (see harness.h): registers one GoogleTest per case and storage
// dtype, runs the op on both backends from the same inputs, and compares.
#include "tests/ops/backend_ops/harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/fill.h"

namespace moepeak::testing::backend_ops {

Generator normal(double scale) {
  return [scale](std::mt19937_64& rng, int64_t n) {
    std::normal_distribution<double> d(0.0, 1.0);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = scale * d(rng);
    return v;
  };
}

Generator uniform(double lo, double hi) {
  return [lo, hi](std::mt19937_64& rng, int64_t n) {
    std::uniform_real_distribution<double> d(lo, hi);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  };
}

Generator integers(int64_t lo, int64_t hi) {
  return [lo, hi](std::mt19937_64& rng, int64_t n) {
    std::uniform_int_distribution<int64_t> d(lo, hi);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<double>(d(rng));
    return v;
  };
}

Generator values(std::vector<double> v) {
  return [v = std::move(v)](std::mt19937_64&, int64_t n) {
    MOEPEAK_CHECK(static_cast<int64_t>(v.size()) == n, "values(): ", v.size(),
                  " values for a tensor of ", n, " elements");
    return v;
  };
}

TensorSpec in(std::string name, Shape shape, Kind kind, Generator fill) {
  return TensorSpec{std::move(name), shape, kind, Role::in, std::move(fill)};
}
TensorSpec out(std::string name, Shape shape, Kind kind) {
  return TensorSpec{std::move(name), shape, kind, Role::out, normal()};
}
TensorSpec inout(std::string name, Shape shape, Kind kind, Generator fill) {
  return TensorSpec{std::move(name), shape, kind, Role::inout, std::move(fill)};
}

std::vector<OpCase>& registry() {
  static std::vector<OpCase> cases;
  return cases;
}

CaseRegistrar::CaseRegistrar(const std::function<std::vector<OpCase>()>& make) {
  for (auto& c : make()) registry().push_back(std::move(c));
}

bool cpu_under_test() {
  const char* env = std::getenv("MOEPEAK_BACKEND_OPS");
  return env != nullptr && std::string(env) == "cpu";
}

std::string skip_reason() {
  return cpu_under_test() || Backend::cuda_available() ? "" : "no CUDA device";
}

Backend& reference_backend() {
  static std::unique_ptr<Backend> b = Backend::create(BackendOptions{});
  return *b;
}

Backend& backend_under_test() {
  static std::unique_ptr<Backend> b = [] {
    BackendOptions opts;
    if (!cpu_under_test()) {
      opts.kind = BackendKind::cuda;
      opts.device_memory = 8ull << 30;
    }
    return Backend::create(opts);
  }();
  return *b;
}

namespace {

bool is_integer(Kind k) { return k == Kind::i32 || k == Kind::i64; }

DType dtype_in_run(Kind kind, DType storage, bool reference) {
  switch (kind) {
    case Kind::floating:
      return reference ? DType::f64 : storage;
    case Kind::state:
      return reference ? DType::f64 : DType::f32;
    case Kind::f64:
      return DType::f64;
    case Kind::i32:
      return DType::i32;
    case Kind::i64:
      return DType::i64;
  }
  return DType::f64;
}

double round_to(DType t, double v) {
  switch (t) {
    case DType::f32:
      return static_cast<float>(v);
    case DType::bf16:
      return static_cast<float>(bf16(static_cast<float>(v)));
    default:
      return v;
  }
}

// One run of a case on one backend: the tensors, filled and poisoned.
struct OpRun {
  std::vector<OwnedTensor> owned;
  std::vector<Tensor> views;
};

OpRun prepare(Backend& backend, const OpCase& c, const std::vector<std::vector<double>>& inputs,
              DType storage, bool reference) {
  OpRun run;
  Stream& stream = backend.default_stream();
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const TensorSpec& spec = c.tensors[i];
    DType t = dtype_in_run(spec.kind, storage, reference);
    run.owned.push_back(OwnedTensor::device(backend, spec.shape, t, LiveSet::workspace, spec.name));
    run.views.push_back(run.owned.back().view());
    if (spec.role == Role::out) {
      ops::fill(run.views.back(),
                is_integer(spec.kind) ? -12345.0 : std::numeric_limits<double>::quiet_NaN(),
                stream);
    } else {
      copy_from_host_as(inputs[i], run.views.back(), backend, stream);
    }
  }
  stream.synchronize();
  return run;
}

class BackendOpTest : public ::testing::Test {
 public:
  BackendOpTest(size_t index, DType storage) : index_(index), storage_(storage) {}

  void TestBody() override {
    if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
    const OpCase& c = registry()[index_];

    std::mt19937_64 rng(c.seed);
    std::vector<std::vector<double>> inputs;
    for (const auto& spec : c.tensors) {
      std::vector<double> v;
      if (spec.role != Role::out) {
        v = spec.fill(rng, spec.shape.numel());
        ASSERT_EQ(static_cast<int64_t>(v.size()), spec.shape.numel()) << spec.name;
        DType t = dtype_in_run(spec.kind, storage_, /*reference=*/false);
        for (auto& x : v) x = round_to(t, x);
      }
      inputs.push_back(std::move(v));
    }

    Backend& ref = reference_backend();
    Backend& dut = backend_under_test();
    OpRun ref_run = prepare(ref, c, inputs, storage_, /*reference=*/true);
    OpRun dut_run = prepare(dut, c, inputs, storage_, /*reference=*/false);
    c.run(ref_run.views, ref.default_stream());
    ref.default_stream().synchronize();
    c.run(dut_run.views, dut.default_stream());
    dut.default_stream().synchronize();

    double tol = storage_ == DType::bf16 ? c.tolerance.bf16 : c.tolerance.f32;
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      const TensorSpec& spec = c.tensors[i];
      if (spec.role == Role::in) continue;
      std::vector<double> want =
          copy_to_host_as_double(ref_run.views[i], ref, ref.default_stream());
      std::vector<double> got = copy_to_host_as_double(dut_run.views[i], dut, dut.default_stream());
      ASSERT_EQ(want.size(), got.size()) << spec.name;
      if (is_integer(spec.kind)) {
        for (size_t j = 0; j < want.size(); ++j) {
          ASSERT_EQ(got[j], want[j]) << spec.name << "[" << j << "]";
        }
        continue;
      }
      double scale = 0, diff = 0;
      size_t worst = 0;
      bool finite = true;
      for (size_t j = 0; j < want.size(); ++j) {
        if (!std::isfinite(got[j]) || !std::isfinite(want[j])) {
          // Both infinite with one sign (a -inf max of an empty state) is agreement.
          if (std::isinf(got[j]) && got[j] == want[j]) continue;
          finite = false;
          worst = j;
          break;
        }
        scale = std::max(scale, std::abs(want[j]));
        double d = std::abs(got[j] - want[j]);
        if (d > diff) {
          diff = d;
          worst = j;
        }
      }
      ASSERT_TRUE(finite) << spec.name << "[" << worst << "] = " << got[worst] << ", reference "
                          << want[worst] << " (an unwritten or non-finite element)";
      double err = scale > 0 ? diff / scale : diff;
      std::printf("  %-12s %-5s err %.2e (tol %.0e)\n", spec.name.c_str(),
                  std::string(dtype_name(storage_)).c_str(), err, tol);
      EXPECT_LE(err, tol) << spec.name << ": worst element " << worst << " = " << got[worst]
                          << ", reference " << want[worst] << ", scale " << scale;
    }
  }

 private:
  size_t index_;
  DType storage_;
};

std::string test_name(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

}  // namespace
}  // namespace moepeak::testing::backend_ops

int main(int argc, char** argv) {
  using namespace moepeak::testing::backend_ops;
  ::testing::InitGoogleTest(&argc, argv);
  const auto& cases = registry();
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<moepeak::DType> storages{moepeak::DType::f32};
    if (cases[i].bf16) storages.push_back(moepeak::DType::bf16);
    for (moepeak::DType storage : storages) {
      std::string name = test_name(cases[i].name) + "_" + std::string(moepeak::dtype_name(storage));
      ::testing::RegisterTest(
          "BackendOps", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
          [i, storage]() -> ::testing::Test* { return new BackendOpTest(i, storage); });
    }
  }
  return RUN_ALL_TESTS();
}
