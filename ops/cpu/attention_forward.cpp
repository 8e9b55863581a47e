// CPU attention forward: flash-style causal grouped-query attention with an optional sliding
// window, attention sinks and packed documents (ops/attention.h for the semantics,
// ops/cpu/attention_common.h for the blocks).
//
//   q: (B, T, nh, dqk)    k: (B, T, nkv, dqk)    v: (B, T, nkv, dv)    out: (B, T, nh, dv)
//   lse: (B, nh, T)       sinks: (nh)            doc_start: (B, T) i32
//
// Per query block, for each key block it visits (for_each_key_block: from the first row's first
// key, the start of its window and document or 0, to the block's last position):
//   S = scale * Q K^T (GEMM over dqk), mask the keys outside each row's window and document (only
//   in blocks where some row masks some key: the diagonal, the window's or document's lower
//   edge),
//   m' = max(m, rowmax S), P = exp(S - m'), l = l * exp(m - m') + rowsum P,
//   acc = acc * exp(m - m') + P V (GEMM, beta = 1; acc is rows x dv);
// then, with sinks, the sink s of the row's head joins the softmax as one more column without a
// value: m' = max(m, s), l = l * exp(m - m') + exp(s - m'), acc = acc * exp(m - m');
// and out = acc / l, lse = m + log l. Without a window, sinks or documents this is the causal loop
// unchanged: the same key blocks, products and order. doc_start's values are tested first
// (check_document_starts).
//
// bf16 storage (fp32 arithmetic, ops/cpu/cpu_storage.h): query rows are widened as they are
// gathered and every key/value block into scratch once per visit (rows dqk or dv apart), the
// arithmetic is the f32 kernel's (sinks widened to fp32), and out is rounded once as it is stored
// (lse is f32).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/runtime/cpu_stream.h"
#include "ops/attention.h"
#include "ops/cpu/attention_common.h"

namespace moepeak::ops {
namespace {

using namespace attention_cpu;

template <typename S>
void forward_kernel(const Geometry& geo, const BlockPlan& plan, const S* q, const S* k, const S* v,
                    const S* sinks, compute_t<S> scale, S* out, compute_t<S>* lse) {
  using T = compute_t<S>;
  const int64_t dqk = geo.qk_dim, dv = geo.v_dim;
  for_each_head_pair<T>(
      geo, plan, /*backward=*/false, kWidened<S>, [&](int64_t b, int64_t g, Scratch<T>& s) {
        for_each_query_block_of(geo, plan, b, g, [&](const QueryBlock& blk) {
          const int64_t rows = blk.rows(plan);
          gather_rows(geo, plan, blk, dqk, q, s.q_rows.data());
          std::fill_n(s.row_max.begin(), rows, -std::numeric_limits<T>::infinity());
          std::fill_n(s.row_sum.begin(), rows, T(0));
          std::fill_n(s.accumulator.begin(), rows * dv, T(0));

          for_each_key_block(plan, blk, [&](int64_t s0, int64_t keys) {
            const bool needs_mask = block_needs_mask(plan, blk, s0, keys);
            const KvOperand<T> kb =
                kv_operand(geo, dqk, k, geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, dqk), keys,
                           s.k_block.data());
            T* scores = s.scores.data();
            gemm(CblasNoTrans, CblasTrans, rows, keys, dqk, scale, s.q_rows.data(), dqk, kb.data,
                 kb.ld, T(0), scores, keys);
            count_scores(rows * keys);

            for (int64_t r = 0; r < rows; ++r) {
              T* row = scores + r * keys;
              const KeySpan span = mask_row(plan, blk, needs_mask, r, s0, keys, row);
              const int64_t visible = span.end - span.begin;
              if (visible == 0) continue;
              T* seen = row + span.begin;
              const T m_old = s.row_max[r];
              const T m_new = std::max(m_old, row_max(seen, visible));
              const T rescale =
                  std::exp(m_old - m_new);  // 0 on the row's first keys (m_old = -inf)
              const T block_sum = exp_shift_sum(seen, visible, m_new);
              s.row_sum[r] = s.row_sum[r] * rescale + block_sum;
              s.row_max[r] = m_new;
              if (rescale != T(1)) {
                T* acc = s.accumulator.data() + r * dv;
                for (int64_t i = 0; i < dv; ++i) acc[i] *= rescale;
              }
            }
            const KvOperand<T> vb =
                kv_operand(geo, dv, v, geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, dv), keys,
                           s.v_block.data());
            gemm(CblasNoTrans, CblasNoTrans, rows, dv, keys, T(1), scores, keys, vb.data, vb.ld,
                 T(1), s.accumulator.data(), dv);
          });

          for (int64_t r = 0; r < rows; ++r) {
            T* acc = s.accumulator.data() + r * dv;
            if (sinks != nullptr) {
              // NOTES: the sink is one more column of the softmax, folded in last like a key block
              // of one key whose value is 0. A sink far below the row's max gives exp(s - m) = 0
              // and rescale = 1: bitwise the result without sinks. A dominant sink gives rescale ->
              // 0 and l -> 1 (never below 1: the larger of m and s contributes exp(0)).
              const T sink = load(sinks[blk.kv_head * plan.group + r % plan.group]);
              const T m_old = s.row_max[r];
              const T m_new = std::max(m_old, sink);
              const T rescale = std::exp(m_old - m_new);
              s.row_sum[r] = s.row_sum[r] * rescale + std::exp(sink - m_new);
              s.row_max[r] = m_new;
              if (rescale != T(1)) {
                for (int64_t i = 0; i < dv; ++i) acc[i] *= rescale;
              }
            }
            const T l = s.row_sum[r];  // >= 1: the row's maximum contributes exp(0)
            for (int64_t i = 0; i < dv; ++i) acc[i] /= l;
            lse[lse_index(geo, plan, blk, r)] = s.row_max[r] + std::log(l);
          }
          scatter_rows(geo, plan, blk, dv, s.accumulator.data(), out);
        });
      });
}

}  // namespace

namespace detail {

void attention_forward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                   const AttentionVariant& variant, const Tensor& out,
                                   const Tensor& lse, AttentionBlocks blocks, Stream& stream) {
  const char* op = "attention_forward";
  check_attention_forward_args(q, k, v, scale, variant, out, lse);
  check_blocks(op, blocks);
  CpuStream& cpu = as_cpu_stream(stream);
  if (q.numel() == 0) return;
  const Geometry geo = geometry_of(q, k, v);
  const int32_t* doc_start =
      variant.doc_start.defined() ? variant.doc_start.data_as<int32_t>() : nullptr;
  const BlockPlan plan = plan_blocks(geo, blocks, variant.window, doc_start);
  dispatch_storage(q.dtype(), op, [&](auto zero) {
    using S = decltype(zero);
    using T = compute_t<S>;  // also lse's dtype (attention_lse_dtype)
    const S* qp = q.data_as<S>();
    const S* kp = k.data_as<S>();
    const S* vp = v.data_as<S>();
    const S* sinksp = variant.sinks.defined() ? variant.sinks.data_as<S>() : nullptr;
    S* outp = out.data_as<S>();
    T* lsep = lse.data_as<T>();
    const T scale_t = static_cast<T>(scale);
    cpu.enqueue([=] {
      if (plan.doc_start != nullptr) check_document_starts(op, geo, plan.doc_start);
      forward_kernel<S>(geo, plan, qp, kp, vp, sinksp, scale_t, outp, lsep);
    });
  });
}

}  // namespace detail

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                           const AttentionVariant& variant, const Tensor& out, const Tensor& lse,
                           Stream& stream) {
  detail::attention_forward_cpu_blocked(q, k, v, scale, variant, out, lse, kAttentionBlocks,
                                        stream);
}

}  // namespace moepeak::ops
