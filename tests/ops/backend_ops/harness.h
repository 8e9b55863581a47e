// test_backend_ops: one harness that runs every op on the backend under test and compares it
// with the CPU backend in float64 (ggml's test-backend-ops, for moepeak's ops).
//
//   build/tests/ops/test_backend_ops                  CUDA under test (f32 and bf16 storage);
//                                                     every test skips without a CUDA device
//   MOEPEAK_BACKEND_OPS=cpu build/tests/ops/test_backend_ops
//                                                     the CPU in f32 and bf16 under test (ctest
//                                                     runs this as test_backend_ops_cpu: the
//                                                     cases and the CPU's bf16 path, no GPU)
//   ... --gtest_filter='*rmsnorm*'                    one op
//
// A case lists its tensors (shape, kind, role, how to fill them) and a function that runs the op
// on them. For each storage dtype the harness
//   1. draws every input from the case's seed and rounds it to the dtype under test, so both
//      runs see the same values and the comparison measures the op's arithmetic;
//   2. runs the op on the CPU with every floating tensor in f64 (the reference), and on the
//      backend under test in that dtype; `out` tensors are poisoned with NaN (integers with
//      -12345) first, so an element an op forgets to write fails;
//   3. compares every `out` and `inout` tensor: floating ones by max |a - ref| / max |ref| within
//      the case's tolerance for the dtype (about 1e-5 for f32, 1e-2 for bf16), integer ones
//      exactly.
// Cases live in tests/ops/backend_ops/cases_<family>.cpp and register themselves with
// MOEPEAK_BACKEND_OPS_CASES.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace moepeak::testing::backend_ops {

// The dtype of a tensor in each run.
enum class Kind {
  floating,  // the dtype under test (f32 | bf16); f64 in the reference
  state,     // f32 under test whatever the storage (fp32 master weights, AdamW moments); f64 ref
  f64,       // f64 in both runs (the cross-entropy fold state)
  i32,
  i64,
};

enum class Role {
  in,     // filled from the generator, not compared
  out,    // poisoned before the run, compared after
  inout,  // filled from the generator, compared after (updated in place or accumulated, +=)
};

using Generator = std::function<std::vector<double>(std::mt19937_64& rng, int64_t numel)>;

// Standard normal values times `scale` (the default generator).
Generator normal(double scale = 1.0);
// Uniform in [lo, hi).
Generator uniform(double lo, double hi);
// Integers uniform in [lo, hi] (inclusive).
Generator integers(int64_t lo, int64_t hi);
// These exact values (the numel must match).
Generator values(std::vector<double> v);

struct TensorSpec {
  std::string name;
  Shape shape;
  Kind kind = Kind::floating;
  Role role = Role::in;
  Generator fill = normal();
};

// Convenience constructors.
TensorSpec in(std::string name, Shape shape, Kind kind = Kind::floating, Generator fill = normal());
TensorSpec out(std::string name, Shape shape, Kind kind = Kind::floating);
TensorSpec inout(std::string name, Shape shape, Kind kind = Kind::floating,
                 Generator fill = normal());

struct Tolerance {
  double f32 = 1e-5;
  double bf16 = 1e-2;
};

struct OpCase {
  std::string name;  // op and shape, e.g. "rmsnorm_forward N=37 H=96" (becomes the test name)
  std::vector<TensorSpec> tensors;
  // Runs the op on views of `tensors`, in the same order, on `stream`.
  std::function<void(const std::vector<Tensor>& t, Stream& stream)> run;
  Tolerance tolerance{};
  bool bf16 = true;  // also run with bf16 storage on CUDA
  uint64_t seed = 1;
};

// The backends of a run: the CPU in f64 (the reference) and the backend under test (CUDA, or the
// CPU with MOEPEAK_BACKEND_OPS=cpu). Created once per process. `skip_reason` is empty when the
// backend under test is usable, else why not (tests then GTEST_SKIP with it).
bool cpu_under_test();
std::string skip_reason();
Backend& reference_backend();
Backend& backend_under_test();

// Every registered case, in registration order.
std::vector<OpCase>& registry();

struct CaseRegistrar {
  explicit CaseRegistrar(const std::function<std::vector<OpCase>()>& make);
};

}  // namespace moepeak::testing::backend_ops

// At namespace scope in a cases file:
//   MOEPEAK_BACKEND_OPS_CASES(norm) { std::vector<OpCase> c; ...; return c; }
#define MOEPEAK_BACKEND_OPS_CASES(family)                                                     \
  static std::vector<::moepeak::testing::backend_ops::OpCase> backend_ops_cases_##family();   \
  static const ::moepeak::testing::backend_ops::CaseRegistrar backend_ops_registrar_##family( \
      backend_ops_cases_##family);                                                            \
  static std::vector<::moepeak::testing::backend_ops::OpCase> backend_ops_cases_##family()
