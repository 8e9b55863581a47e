// CPU attention backward: flash-style causal grouped-query attention with an optional sliding
// window, attention sinks and packed documents (ops/attention.h for the semantics,
// ops/cpu/attention_common.h for the blocks).
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv)  lse: (B, nh, T)            sinks, dsinks: (nh)
//   doc_start: (B, T) i32
//
// Per query block: D = rowsum(dout * out) (over dv); for each key block the forward visited,
//   P = exp(S - lse) (0 outside each row's window and document), dP = dout V^T, dV += P^T dout,
//   dS = P * (dP - D), dQ += scale * dS K, dK += scale * dS^T Q  (dK, dV straight into dk, dv with
//   beta = 1; the products with V and dout run over dv, those with Q and K over dqk).
// The forward's lse already holds the sink and out is normalised by it, so this is the plain
// backward on (out, lse); the sink adds only dsinks, in a pass of its own (sinks_gradient).
// The (b, g) pairs run on the rank's compute threads, one thread per pair whole (for_each_head_
// pair); a pair's query blocks run in a fixed order (t0), so dk/dv sum the blocks — and, inside a
// block's GEMM, the query heads of the group — in a fixed order: results are bitwise
// reproducible and the same on any number of threads.
//
// bf16 storage (fp32 arithmetic, ops/cpu/cpu_storage.h): two passes (backward_kernel_widened),
// dq by query blocks, dk/dv by key blocks, each key block's fp32 sums in scratch. Both visit only
// the (query block, key block) pairs of the forward: with documents, none wholly masked.
#include <algorithm>
#include <cmath>

#include "core/runtime/cpu_stream.h"
#include "ops/attention.h"
#include "ops/cpu/attention_common.h"

namespace moepeak::ops {
namespace {

using namespace attention_cpu;

// A query block's rows for the backward: q and dout gathered, and per row lse (s.row_sum) and
// D = rowsum(dout * out) (s.row_delta; out is read where it lies, in the gather's row order).
template <typename S>
void load_backward_rows(const Geometry& geo, const BlockPlan& plan, const QueryBlock& blk,
                        const S* q, const S* out, const compute_t<S>* lse, const S* dout,
                        Scratch<compute_t<S>>& s) {
  using T = compute_t<S>;
  const int64_t rows = blk.rows(plan), dv = geo.v_dim;
  gather_rows(geo, plan, blk, geo.qk_dim, q, s.q_rows.data());
  gather_rows(geo, plan, blk, dv, dout, s.dout_rows.data());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = r / plan.group, hh = r % plan.group;
    const S* out_row =
        out + geo.offset(blk.b, blk.t0 + p, blk.kv_head * plan.group + hh, geo.heads, dv);
    const T* dout_row = s.dout_rows.data() + r * dv;
    T delta = 0;
    for (int64_t i = 0; i < dv; ++i) delta += dout_row[i] * load(out_row[i]);
    s.row_delta[r] = delta;
    s.row_sum[r] = lse[lse_index(geo, plan, blk, r)];
  }
}

// P = exp(scale * Q K^T - lse) of keys [s0, s0 + keys) into s.scores, 0 outside each row's
// window and document (dqk: the width of Q and K).
template <typename T>
void backward_probs(const BlockPlan& plan, const QueryBlock& blk, int64_t rows, int64_t s0,
                    int64_t keys, int64_t dqk, const KvOperand<T>& kb, T scale, Scratch<T>& s) {
  const bool needs_mask = block_needs_mask(plan, blk, s0, keys);
  T* probs = s.scores.data();
  gemm(CblasNoTrans, CblasTrans, rows, keys, dqk, scale, s.q_rows.data(), dqk, kb.data, kb.ld, T(0),
       probs, keys);
  count_scores(rows * keys);
  for (int64_t r = 0; r < rows; ++r) {
    T* row = probs + r * keys;
    const KeySpan span = mask_row(plan, blk, needs_mask, r, s0, keys, row);
    if (span.end > span.begin) exp_shift_sum(row + span.begin, span.end - span.begin, s.row_sum[r]);
  }
}

// dP = dout V^T, then dS = P * (dP - D): s.scores turns from P into dS (dv: the width of dout
// and V).
template <typename T>
void backward_dscores(int64_t rows, int64_t keys, int64_t dv, const KvOperand<T>& vb,
                      Scratch<T>& s) {
  gemm(CblasNoTrans, CblasTrans, rows, keys, dv, T(1), s.dout_rows.data(), dv, vb.data, vb.ld, T(0),
       s.dprobs.data(), keys);
  for (int64_t r = 0; r < rows; ++r)
    dscores(s.scores.data() + r * keys, s.dprobs.data() + r * keys, keys, s.row_delta[r]);
}

// f32 and f64: one pass over the query blocks; dK and dV sum in dk, dv (GEMMs with beta = 1).
template <typename T>
void backward_kernel(const Geometry& geo, const BlockPlan& plan, const T* q, const T* k, const T* v,
                     const T* out, const T* lse, const T* dout, T scale, T* dq, T* dk, T* dv) {
  const int64_t dqk = geo.qk_dim, d_v = geo.v_dim;
  const int64_t k_stride = geo.kv_heads * dqk, v_stride = geo.kv_heads * d_v;
  const int64_t kv_rows = geo.batch * geo.seq * geo.kv_heads;
  std::fill_n(dk, kv_rows * dqk, T(0));
  std::fill_n(dv, kv_rows * d_v, T(0));

  for_each_head_pair<T>(
      geo, plan, /*backward=*/true, /*widened=*/false, [&](int64_t pb, int64_t pg, Scratch<T>& s) {
        for_each_query_block_of(geo, plan, pb, pg, [&](const QueryBlock& blk) {
          const int64_t rows = blk.rows(plan);
          T* dq_rows = s.accumulator.data();
          load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
          std::fill_n(dq_rows, rows * dqk, T(0));

          for_each_key_block(plan, blk, [&](int64_t s0, int64_t keys) {
            const int64_t k_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, dqk);
            const int64_t v_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, d_v);
            const KvOperand<T> kb{k + k_offset, k_stride}, vb{v + v_offset, v_stride};
            backward_probs(plan, blk, rows, s0, keys, dqk, kb, scale, s);
            // dV += P^T dout;  dS = P * (dout V^T - D);  dQ += scale * dS K;  dK += scale * dS^T Q.
            gemm(CblasTrans, CblasNoTrans, keys, d_v, rows, T(1), s.scores.data(), keys,
                 s.dout_rows.data(), d_v, T(1), dv + v_offset, v_stride);
            backward_dscores(rows, keys, d_v, vb, s);
            gemm(CblasNoTrans, CblasNoTrans, rows, dqk, keys, scale, s.scores.data(), keys, kb.data,
                 kb.ld, T(1), dq_rows, dqk);
            gemm(CblasTrans, CblasNoTrans, keys, dqk, rows, scale, s.scores.data(), keys,
                 s.q_rows.data(), dqk, T(1), dk + k_offset, k_stride);
          });
          scatter_rows(geo, plan, blk, dqk, dq_rows, dq);
        });
      });
}

// bf16 storage: each output element is rounded once, so dK and dV cannot sum across query blocks
// in their bf16 tensors, and an fp32 sum over a whole sequence would grow with T. Two passes
// instead, as the CUDA kernels run (ops/cuda/attention.cu): dQ query block by query block (the
// loop above without the dV and dK products), then dK and dV key block by key block, one key
// block's fp32 sums in scratch, rounded once. Both passes visit every (query block, key block)
// pair of the one-pass loop with its products, sizes and order of accumulation, so each output is
// the f32 kernel's on the widened inputs, rounded once; P and dS are computed twice.
template <typename S>
void backward_kernel_widened(const Geometry& geo, const BlockPlan& plan, const S* q, const S* k,
                             const S* v, const S* out, const compute_t<S>* lse, const S* dout,
                             compute_t<S> scale, S* dq, S* dk, S* dv) {
  using T = compute_t<S>;
  const int64_t dqk = geo.qk_dim, d_v = geo.v_dim;
  const int64_t k_stride = geo.kv_heads * dqk, v_stride = geo.kv_heads * d_v;

  for_each_head_pair<T>(
      geo, plan, /*backward=*/true, /*widened=*/true, [&](int64_t b, int64_t g, Scratch<T>& s) {
        // Pass 1: dQ += scale * dS K over the key blocks of each query block.
        for_each_query_block_of(geo, plan, b, g, [&](const QueryBlock& blk) {
          const int64_t rows = blk.rows(plan);
          T* dq_rows = s.accumulator.data();
          load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
          std::fill_n(dq_rows, rows * dqk, T(0));
          for_each_key_block(plan, blk, [&](int64_t s0, int64_t keys) {
            const int64_t k_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, dqk);
            const int64_t v_offset = geo.offset(blk.b, s0, blk.kv_head, geo.kv_heads, d_v);
            const KvOperand<T> kb = kv_operand(geo, dqk, k, k_offset, keys, s.k_block.data());
            const KvOperand<T> vb = kv_operand(geo, d_v, v, v_offset, keys, s.v_block.data());
            backward_probs(plan, blk, rows, s0, keys, dqk, kb, scale, s);
            backward_dscores(rows, keys, d_v, vb, s);
            gemm(CblasNoTrans, CblasNoTrans, rows, dqk, keys, scale, s.scores.data(), keys, kb.data,
                 kb.ld, T(1), dq_rows, dqk);
          });
          scatter_rows(geo, plan, blk, dqk, dq_rows, dq);
        });

        // Pass 2: dV += P^T dout and dK += scale * dS^T Q of each key block over the query blocks
        // that visit it (last position >= s0, first key block <= s0), in the one-pass loop's order
        // and with its key counts (its key block stops at the query block's last position).
        // first_key_block grows with t0 (a window's start and doc_start both do), so the first
        // query block past s0 ends the loop: with documents, the query blocks of later documents
        // are never visited.
        T* dk_block = s.dk_block.data();
        T* dv_block = s.dv_block.data();
        for (int64_t s0 = 0; s0 < geo.seq; s0 += plan.keys) {
          const int64_t block_keys = std::min(plan.keys, geo.seq - s0);
          const int64_t k_offset = geo.offset(b, s0, g, geo.kv_heads, dqk);
          const int64_t v_offset = geo.offset(b, s0, g, geo.kv_heads, d_v);
          const KvOperand<T> kb = kv_operand(geo, dqk, k, k_offset, block_keys, s.k_block.data());
          const KvOperand<T> vb = kv_operand(geo, d_v, v, v_offset, block_keys, s.v_block.data());
          std::fill_n(dk_block, block_keys * dqk, T(0));
          std::fill_n(dv_block, block_keys * d_v, T(0));
          for (int64_t t0 = s0 / plan.positions * plan.positions; t0 < geo.seq;
               t0 += plan.positions) {
            const QueryBlock blk{b, g, t0, std::min(plan.positions, geo.seq - t0)};
            if (first_key_block(plan, blk) > s0) break;  // and so for every later query block
            const int64_t rows = blk.rows(plan);
            const int64_t keys = std::min(block_keys, blk.last_position() + 1 - s0);
            load_backward_rows(geo, plan, blk, q, out, lse, dout, s);
            backward_probs(plan, blk, rows, s0, keys, dqk, kb, scale, s);
            gemm(CblasTrans, CblasNoTrans, keys, d_v, rows, T(1), s.scores.data(), keys,
                 s.dout_rows.data(), d_v, T(1), dv_block, d_v);
            backward_dscores(rows, keys, d_v, vb, s);
            gemm(CblasTrans, CblasNoTrans, keys, dqk, rows, scale, s.scores.data(), keys,
                 s.q_rows.data(), dqk, T(1), dk_block, dqk);
          }
          for (int64_t j = 0; j < block_keys; ++j) {
            narrow(dk_block + j * dqk, dk + k_offset + j * k_stride, dqk);
            narrow(dv_block + j * d_v, dv + v_offset + j * v_stride, d_v);
          }
        }
      });
}

// dsinks[h] += -sum_{b,t} exp(sinks[h] - lse[b,h,t]) * D[b,t,h], D = dout . out over dv: in
// double, each head's sum in (b, t) order, added to dsinks once (one rounding to its dtype).
template <typename S>
void sinks_gradient(const Geometry& geo, const S* sinks, const S* out, const S* dout,
                    const compute_t<S>* lse, compute_t<S>* dsinks) {
  const int64_t d = geo.v_dim;
  for (int64_t h = 0; h < geo.heads; ++h) {
    const double sink = load(sinks[h]);
    double sum = 0;
    for (int64_t b = 0; b < geo.batch; ++b)
      for (int64_t t = 0; t < geo.seq; ++t) {
        const int64_t row = geo.offset(b, t, h, geo.heads, d);
        double delta = 0;
        for (int64_t i = 0; i < d; ++i)
          delta +=
              static_cast<double>(load(dout[row + i])) * static_cast<double>(load(out[row + i]));
        const double row_lse = lse[(b * geo.heads + h) * geo.seq + t];
        sum += std::exp(sink - row_lse) * delta;
      }
    dsinks[h] = static_cast<compute_t<S>>(static_cast<double>(dsinks[h]) - sum);
  }
}

}  // namespace

namespace detail {

void attention_backward_cpu_blocked(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    double scale, const AttentionVariant& variant, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv, const Tensor& dsinks,
                                    AttentionBlocks blocks, Stream& stream) {
  const char* op = "attention_backward";
  check_attention_backward_args(q, k, v, out, lse, dout, scale, variant, dq, dk, dv, dsinks);
  check_blocks(op, blocks);
  CpuStream& cpu = as_cpu_stream(stream);
  if (q.numel() == 0) return;
  const Geometry geo = geometry_of(q, k, v);
  const int32_t* doc_start =
      variant.doc_start.defined() ? variant.doc_start.data_as<int32_t>() : nullptr;
  const BlockPlan plan = plan_blocks(geo, blocks, variant.window, doc_start);
  dispatch_storage(q.dtype(), op, [&](auto zero) {
    using S = decltype(zero);
    using T = compute_t<S>;  // also the dtype of lse and dsinks
    const S* qp = q.data_as<S>();
    const S* kp = k.data_as<S>();
    const S* vp = v.data_as<S>();
    const S* outp = out.data_as<S>();
    const T* lsep = lse.data_as<T>();
    const S* doutp = dout.data_as<S>();
    S* dqp = dq.data_as<S>();
    S* dkp = dk.data_as<S>();
    S* dvp = dv.data_as<S>();
    const S* sinksp = dsinks.defined() ? variant.sinks.data_as<S>() : nullptr;
    T* dsinksp = dsinks.defined() ? dsinks.data_as<T>() : nullptr;
    const T scale_t = static_cast<T>(scale);
    cpu.enqueue([=] {
      if (plan.doc_start != nullptr) check_document_starts(op, geo, plan.doc_start);
      if constexpr (kWidened<S>) {
        backward_kernel_widened<S>(geo, plan, qp, kp, vp, outp, lsep, doutp, scale_t, dqp, dkp,
                                   dvp);
      } else {
        backward_kernel<S>(geo, plan, qp, kp, vp, outp, lsep, doutp, scale_t, dqp, dkp, dvp);
      }
      if (dsinksp != nullptr) sinks_gradient<S>(geo, sinksp, outp, doutp, lsep, dsinksp);
    });
  });
}

}  // namespace detail

void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, double scale,
                            const AttentionVariant& variant, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dsinks, Stream& stream) {
  detail::attention_backward_cpu_blocked(q, k, v, out, lse, dout, scale, variant, dq, dk, dv,
                                         dsinks, kAttentionBlocks, stream);
}

}  // namespace moepeak::ops
