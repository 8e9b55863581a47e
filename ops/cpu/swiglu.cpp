// CPU SwiGLU, forward and backward, plain and clamped (gpt-oss): element-wise loops over (M, F)
// (see ops/swiglu.h), in the compute type of the storage (fp32 for f32 and bf16,
// ops/cpu/cpu_storage.h), each output stored (rounded) once. The clamped ops with the default
// parameters call the plain ones.
#include "ops/swiglu.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/parallel_ranges.h"

namespace moepeak::ops {
namespace {

// Elements per parallel range: below two of these an op runs on its stream's thread alone.
constexpr int64_t kElementsPerTask = 16384;

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

void check_swiglu_params(const char* op, const SwigluParams& params) {
  MOEPEAK_CHECK(params.limit > 0, op, ": SwigluParams.limit must be > 0 (or +infinity), got ",
                params.limit);
  MOEPEAK_CHECK(std::isfinite(params.alpha) && std::isfinite(params.up_offset), op,
                ": SwigluParams.alpha and up_offset must be finite, got ", params.alpha, " and ",
                params.up_offset);
}

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
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const compute_t<T> av = load(ap[i]);
          store(hp + i, av * sigmoid(av) * load(bp[i]));
        }
      });
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
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
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
  });
}

// ---- the clamped SwiGLU (gpt-oss) --------------------------------------------------------------

namespace {

// The parameters in the compute type C.
template <typename C>
struct ClampedSwiglu {
  C alpha, limit, up_offset;
  explicit ClampedSwiglu(const SwigluParams& p)
      : alpha(static_cast<C>(p.alpha)),
        limit(static_cast<C>(p.limit)),
        up_offset(static_cast<C>(p.up_offset)) {}
  // min(a, limit) and clamp(b, -limit, limit), NaN passing through as in torch.clamp.
  C gate(C a) const { return a > limit ? limit : a; }
  C up(C b) const { return b < -limit ? -limit : b > limit ? limit : b; }
};

}  // namespace

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const SwigluParams& params,
                        const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cpu";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_forward_cpu(a, b, h, stream);
    return;
  }
  check_swiglu_forward_args(op, a, b, h);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* ap = a.data_as<T>();  // (M, F)
    const T* bp = b.data_as<T>();  // (M, F)
    T* hp = h.data_as<T>();        // (M, F)
    const int64_t n = a.numel();
    const ClampedSwiglu<C> p(params);
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const C g = p.gate(load(ap[i])), u = p.up(load(bp[i]));
          const C glu = g * sigmoid(p.alpha * g);
          store(hp + i, (u + p.up_offset) * glu);
        }
      });
    });
  });
}

void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh,
                         const SwigluParams& params, const Tensor& da, const Tensor& db,
                         Stream& stream) {
  const char* op = "swiglu_backward_cpu";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_backward_cpu(a, b, dh, da, db, stream);
    return;
  }
  check_swiglu_backward_args(op, a, b, dh, da, db);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* ap = a.data_as<T>();    // (M, F)
    const T* bp = b.data_as<T>();    // (M, F)
    const T* dhp = dh.data_as<T>();  // (M, F)
    T* dap = da.data_as<T>();        // (M, F)
    T* dbp = db.data_as<T>();        // (M, F)
    const int64_t n = a.numel();
    const ClampedSwiglu<C> p(params);
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const C av = load(ap[i]), bv = load(bp[i]), dhv = load(dhp[i]);
          const C g = p.gate(av), u = p.up(bv);
          const C ag = p.alpha * g;
          const C s = sigmoid(ag);
          // d(g * s)/dg = s + alpha * g * s * (1 - s); the clamps pass the gradient on their
          // inclusive ranges (a NaN input fails both tests and gets 0).
          const bool a_passes = av <= p.limit, b_passes = bv >= -p.limit && bv <= p.limit;
          const C dglu = s * (C(1) + ag * (C(1) - s));
          // Element i is read in full before it is written, so da or db may alias an input.
          store(dap + i, a_passes ? dhv * (u + p.up_offset) * dglu : C(0));
          store(dbp + i, b_passes ? dhv * (g * s) : C(0));
        }
      });
    });
  });
}

}  // namespace moepeak::ops
