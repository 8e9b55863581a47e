// CPU attention: the argument checks of every backend's attention (ops/attention.h), the kernels'
// description, the count of score entries the CPU kernels compute, and the CPU kernels' test of
// doc_start's values. The kernels:
// ops/cpu/attention_forward.cpp and attention_backward.cpp, with the parts they share in
// ops/cpu/attention_common.h and the AVX2 row kernels in ops/cpu/attention_rows.cpp.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/cpu/attention_common.h"

namespace moepeak::ops {
namespace {

std::atomic<int64_t> g_scores_computed{0};

void check_same(const Tensor& t, const Shape& shape, DType dtype, const char* op, const char* name,
                const char* layout) {
  if (!t.defined() && shape.numel() > 0)
    MOEPEAK_THROW(op, ": ", name, " ", layout, " is undefined");
  if (t.shape() != shape || t.dtype() != dtype)
    MOEPEAK_THROW(op, ": ", name, " must be ", layout, " = ", dtype_name(dtype), shape.str(),
                  ", got ", t.str());
}

// NOTES: q and k have the query/key head dim dqk, v the value head dim dv (the width of out);
// dv may differ from dqk (DeepSeek-V3's MLA: 192 and 128). Both are read from the shapes.
void check_common(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                  const AttentionVariant& variant, const Tensor& out, const Tensor& lse) {
  if (q.ndim() != 4) MOEPEAK_THROW(op, ": q must be (B, T, nh, dqk), got ", q.str());
  if (q.dtype() != DType::f32 && q.dtype() != DType::f64 && q.dtype() != DType::bf16)
    MOEPEAK_THROW(op, " supports f32, bf16 and f64, got q ", q.str());
  const int64_t batch = q.size(0), seq = q.size(1), heads = q.size(2), qk_dim = q.size(3);
  const int64_t kv_heads = k.ndim() == 4 ? k.size(2) : 0;
  if (k.ndim() != 4 || k.size(0) != batch || k.size(1) != seq || k.size(3) != qk_dim ||
      kv_heads < 1)
    MOEPEAK_THROW(op, ": k must be (B, T, nkv, dqk) with B, T, dqk of q ", q.str(), ", got ",
                  k.str());
  if (v.ndim() != 4 || v.size(0) != batch || v.size(1) != seq || v.size(2) != kv_heads ||
      v.size(3) < 1)
    MOEPEAK_THROW(op, ": v must be (B, T, nkv, dv) with B, T, nkv of k ", k.str(),
                  " and dv >= 1, got ", v.str());
  const int64_t v_dim = v.size(3);
  if (heads < 1 || qk_dim < 1 || heads % kv_heads != 0)
    MOEPEAK_THROW(op, ": query heads nh = ", heads, " must be a positive multiple of kv heads",
                  " nkv = ", kv_heads, " and dqk = ", qk_dim, " positive (q ", q.str(), ", k ",
                  k.str(), ")");
  if (heads * std::max(qk_dim, v_dim) > INT_MAX / 4 || seq > INT_MAX)
    MOEPEAK_THROW(op, ": q ", q.str(), " with v ", v.str(), " exceeds the 32-bit GEMM dimensions");
  if (!std::isfinite(scale) || scale <= 0)
    MOEPEAK_THROW(op, ": scale must be finite and positive, got ", scale);
  if (variant.window < 0)
    MOEPEAK_THROW(op, ": window must be >= 0 (0: plain causal), got ", variant.window);
  check_same(q, q.shape(), q.dtype(), op, "q", "(B, T, nh, dqk)");
  check_same(k, k.shape(), q.dtype(), op, "k", "(B, T, nkv, dqk)");
  check_same(v, v.shape(), q.dtype(), op, "v", "(B, T, nkv, dv)");
  check_same(out, Shape{batch, seq, heads, v_dim}, q.dtype(), op, "out", "(B, T, nh, dv)");
  check_same(lse, Shape{batch, heads, seq}, attention_lse_dtype(q.dtype()), op, "lse",
             "(B, nh, T)");
  if (variant.sinks.defined())
    check_same(variant.sinks, Shape{heads}, q.dtype(), op, "sinks", "(nh)");
  if (variant.doc_start.defined()) {
    check_same(variant.doc_start, Shape{batch, seq}, DType::i32, op, "doc_start", "(B, T)");
    if (runs_on_cuda(variant.doc_start) != runs_on_cuda(out))
      MOEPEAK_THROW(op, ": doc_start ", variant.doc_start.str(), " must be on out's backend (",
                    runs_on_cuda(out) ? "CUDA device memory" : "CPU memory", "), like out ",
                    out.str());
  }
}

}  // namespace

namespace attention_cpu {
void count_scores(int64_t n) { g_scores_computed.fetch_add(n, std::memory_order_relaxed); }

void check_document_starts(const char* op, const Geometry& geo, const int32_t* doc_start) {
  for (int64_t b = 0; b < geo.batch; ++b)
    for (int64_t t = 0; t < geo.seq; ++t) {
      const int64_t first = doc_start[b * geo.seq + t];
      const int64_t before = t > 0 ? doc_start[b * geo.seq + t - 1] : 0;
      if (first < before || first > t)
        MOEPEAK_THROW(
            op, ": doc_start[", b, "][", t, "] = ", first,
            " breaks its contract: 0 <= doc_start[b][t] <= t, non-decreasing in t",
            t > 0 ? " (doc_start[b][t - 1] = " + std::to_string(before) + ")" : std::string());
    }
}
}  // namespace attention_cpu

void check_attention_forward_args(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                  const AttentionVariant& variant, const Tensor& out,
                                  const Tensor& lse) {
  check_common("attention_forward", q, k, v, scale, variant, out, lse);
}

void check_attention_backward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout,
                                   double scale, const AttentionVariant& variant, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const Tensor& dsinks) {
  const char* op = "attention_backward";
  check_common(op, q, k, v, scale, variant, out, lse);
  check_same(dout, out.shape(), q.dtype(), op, "dout", "(B, T, nh, dv)");
  check_same(dq, q.shape(), q.dtype(), op, "dq", "(B, T, nh, dqk)");
  check_same(dk, k.shape(), q.dtype(), op, "dk", "(B, T, nkv, dqk)");
  check_same(dv, v.shape(), q.dtype(), op, "dv", "(B, T, nkv, dv)");
  if (dsinks.defined()) {
    if (!variant.sinks.defined())
      MOEPEAK_THROW(op, ": dsinks ", dsinks.str(),
                    " is given but sinks is undefined (no sinks, no sink gradient)");
    check_same(dsinks, Shape{q.size(2)}, attention_lse_dtype(q.dtype()), op, "dsinks", "(nh)");
  }
}

namespace detail {
int64_t attention_cpu_scores_computed() {
  return g_scores_computed.load(std::memory_order_relaxed);
}
}  // namespace detail

const char* attention_kernels(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out) {
  if (!runs_on_cuda(out)) return "cpu: OpenBLAS blocks";
#ifdef MOEPEAK_WITH_CUDA
  return attention_kernels_cuda(q, k, v, out);
#else
  (void)q, (void)k, (void)v;
  throw_no_cuda("attention_kernels");
#endif
}

}  // namespace moepeak::ops
