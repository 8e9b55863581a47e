// CPU SwiGLU, forward and backward: element-wise loops over (M, F) (see ops/swiglu.h), in the
// compute type of the storage (fp32 for f32 and bf16, ops/cpu/cpu_storage.h), each output stored
// (rounded) once.
#include "ops/swiglu.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

template <typename T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

// a: (M, F) float; every other tensor: a's shape and dtype.
void check_same_as_a(const char* op, const Tensor& a,
                     std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  MOEPEAK_CHECK(a.ndim() == 2, op, ": a must be (M, F), got ", a.str());
  for (const auto& [t, name] : others)
    t->expect(a.shape(), a.dtype(), std::string(op) + ": " + name);
}

}  // namespace

void check_swiglu_forward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& h) {
  check_same_as_a(op, a, {{&b, "b"}, {&h, "h"}});
}

void check_swiglu_backward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& dh,
                                const Tensor& da, const Tensor& db) {
  check_same_as_a(op, a, {{&b, "b"}, {&dh, "dh"}, {&da, "da"}, {&db, "db"}});
}

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cpu";
  check_swiglu_forward_args(op, a, b, h);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();  // (M, F)
    const T* bp = b.data_as<T>();  // (M, F)
    T* hp = h.data_as<T>();        // (M, F)
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t i = 0; i < n; ++i) {
        const compute_t<T> av = load(ap[i]);
        store(hp + i, av * sigmoid(av) * load(bp[i]));
      }
    });
  });
}

void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                         const Tensor& db, Stream& stream) {
  const char* op = "swiglu_backward_cpu";
  check_swiglu_backward_args(op, a, b, dh, da, db);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();    // (M, F)
    const T* bp = b.data_as<T>();    // (M, F)
    const T* dhp = dh.data_as<T>();  // (M, F)
    T* dap = da.data_as<T>();        // (M, F)
    T* dbp = db.data_as<T>();        // (M, F)
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      using C = compute_t<T>;
      for (int64_t i = 0; i < n; ++i) {
        const C av = load(ap[i]), bv = load(bp[i]);
        C s = sigmoid(av);
        C silu = av * s;
        C dsilu = s * (C(1) + av * (C(1) - s));
        C g = load(dhp[i]);
        // Element i is read in full before it is written, so da or db may alias an input.
        store(dap + i, g * bv * dsilu);
        store(dbp + i, g * silu);
      }
    });
  });
}

}  // namespace moepeak::ops
