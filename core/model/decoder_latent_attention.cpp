// DecoderModel's multi-head latent attention (AttentionKind::latent, DeepSeek-V2/V3; see
// decoder_spec.h): forward and backward of one layer's attention block on this rank's tokens,
// with the Ulysses exchange to whole sequences of nh/Sp heads around the attention op.
//
//   n1 = norm(x)                                                   (N, H)
//   q  = q_b(norm_q(q_a(n1)))  or  q(n1)                           (N, nh, d)   Hub order
//                                                                  [nope | rope] per head
//   c  = kv_a(n1) = [c_kv | k_rope]                                (N, r_kv + rope)
//   kv = kv_b(norm_kv(c_kv))                                       (N, nh, nope + dv)
//   q', k'  (N, nh, d) in the order [rope | nope] per head: q's parts swapped, RoPE on the first
//           rope dims; k' = [rope(k_rope) the same for every head | kv's nope part]
//   v'      (N, nh, dv) kv's value part
//   out = attention(q', k', v') with the family's scale            (N, nh, dv)
//   h = x + o(out)
// NOTES: q' and k' hold each head's dims in another order than the Hub's (rope first, so the RoPE
// op's partial rotary, which rotates a head's first rotary_dim dims, applies); a dot product does
// not depend on the order of its terms' pairs, so the scores are the same (to the order of the
// summation). The rotary key is rotated once (N, 1, rope) and copied into every head; its
// gradient is the sum over heads, taken in head order.
#include <cmath>

#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/decoder_activations.h"
#include "ops/attention.h"
#include "ops/copy_2d.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace moepeak {

using schedules::HeadKind;

namespace {

// Copies `width` columns at column `from_col` of `src`'s rows (pitch src_pitch) to column `to_col`
// of `dst`'s rows (pitch dst_pitch), for `rows` rows.
void copy_columns(const Tensor& src, int64_t from_col, int64_t src_pitch, const Tensor& dst,
                  int64_t to_col, int64_t dst_pitch, int64_t rows, int64_t width, Stream& stream) {
  ops::copy_2d(src, ops::Block2d{from_col, src_pitch}, dst, ops::Block2d{to_col, dst_pitch}, rows,
               width, stream);
}

}  // namespace

schedules::UlyssesLayout DecoderModel::values_layout() const {
  schedules::UlyssesLayout v = ulysses_;
  v.head_dim = spec_.layers.front().attention.value_dim();
  return v;
}

OwnedTensor DecoderModel::ulysses_staging() const {
  const schedules::UlyssesLayout V = values_layout();
  const bool values_larger = schedules::ulysses_exchange_bytes(V, dtype_) >
                             schedules::ulysses_exchange_bytes(ulysses_, dtype_);
  return schedules::make_ulysses_staging(backend_, values_larger ? V : ulysses_, dtype_);
}

OwnedTensor DecoderModel::latent_attention_forward(int layer, const Group& w, const Tensor& x,
                                                   const TokenBatch& batch, LayerActivations& a) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const AttentionSpec& A = spec_.layers[layer].attention;
  const schedules::UlyssesLayout& U = ulysses_;
  const schedules::UlyssesLayout Uv = values_layout();
  const int64_t N = x.size(0), H = spec_.hidden, B = U.batch, T = batch.seq_len;
  const int64_t nh = A.heads, d = A.head_dim, dv = A.value_dim(), dr = A.rope_dim, dn = d - dr;
  const int64_t rkv = A.kv_lora_rank;
  Comm& sp = layout_.sequence();
  const bool exchange = sp.world_size() > 1;

  a.n1 = device(Shape{N, H}, LiveSet::attention, "input norm");
  a.rstd1 = device(Shape{N}, LiveSet::attention, "input norm rstd");
  ops::rmsnorm_forward(x, w.value(L.input_norm), spec_.norm_eps, a.n1, a.rstd1, stream_,
                       spec_.norm_order);

  // q in the Hub's order (N, nh, [nope | rope]).
  OwnedTensor q_hub = device(Shape{N, nh * d}, LiveSet::workspace, "q (Hub order)");
  if (A.q_lora_rank > 0) {
    const int64_t rq = A.q_lora_rank;
    a.q_latent = device(Shape{N, rq}, LiveSet::attention, "q latent");
    a.q_latent_normed = device(Shape{N, rq}, LiveSet::attention, "q latent norm");
    a.rstd_q_latent = device(Shape{N}, LiveSet::attention, "q latent norm rstd");
    ops::linear_forward(a.n1, w.value(L.q_a), a.q_latent, false, stream_);
    ops::rmsnorm_forward(a.q_latent, w.value(L.q_a_norm), A.latent_norm_eps, a.q_latent_normed,
                         a.rstd_q_latent, stream_, spec_.norm_order);
    ops::linear_forward(a.q_latent_normed, w.value(L.q_b), q_hub, false, stream_);
  } else {
    ops::linear_forward(a.n1, w.value(L.q), q_hub, false, stream_);
  }

  // The key/value latent and the rotary key.
  OwnedTensor c = device(Shape{N, rkv + dr}, LiveSet::workspace, "kv_a projection");
  ops::linear_forward(a.n1, w.value(L.kv_a), c, false, stream_);
  a.kv_latent = device(Shape{N, rkv}, LiveSet::attention, "kv latent");
  copy_columns(c, 0, rkv + dr, a.kv_latent, 0, rkv, N, rkv, stream_);
  OwnedTensor k_rope = device(Shape{N, dr}, LiveSet::workspace, "rotary key");
  copy_columns(c, rkv, rkv + dr, k_rope, 0, dr, N, dr, stream_);
  c.reset();
  ops::rope_forward(k_rope.view().reshape(Shape{N, 1, dr}), batch.positions, rope_, stream_);
  a.kv_latent_normed = device(Shape{N, rkv}, LiveSet::attention, "kv latent norm");
  a.rstd_kv_latent = device(Shape{N}, LiveSet::attention, "kv latent norm rstd");
  ops::rmsnorm_forward(a.kv_latent, w.value(L.kv_a_norm), A.latent_norm_eps, a.kv_latent_normed,
                       a.rstd_kv_latent, stream_, spec_.norm_order);
  OwnedTensor kv = device(Shape{N, nh * (dn + dv)}, LiveSet::workspace, "kv_b projection");
  ops::linear_forward(a.kv_latent_normed, w.value(L.kv_b), kv, false, stream_);

  // q', k' (N, nh, [rope | nope]) and v' (N, nh, dv).
  OwnedTensor q = device(Shape{N, nh * d}, LiveSet::attention, "q");
  copy_columns(q_hub, dn, d, q, 0, d, N * nh, dr, stream_);
  copy_columns(q_hub, 0, d, q, dr, d, N * nh, dn, stream_);
  q_hub.reset();
  ops::rope_forward(q.view().reshape(Shape{N, nh, d}), batch.positions, rope_, stream_);
  OwnedTensor k = device(Shape{N, nh * d}, LiveSet::attention, "k");
  for (int64_t h = 0; h < nh; ++h) copy_columns(k_rope, 0, dr, k, h * d, nh * d, N, dr, stream_);
  copy_columns(kv, 0, dn + dv, k, dr, d, N * nh, dn, stream_);
  OwnedTensor v = device(Shape{N, nh * dv}, LiveSet::attention, "v");
  copy_columns(kv, dn, dn + dv, v, 0, dv, N * nh, dv, stream_);
  kv.reset();
  k_rope.reset();

  OwnedTensor staging;
  if (!exchange) {
    a.q = std::move(q);
    a.k = std::move(k);
    a.v = std::move(v);
  } else {
    staging = ulysses_staging();
    auto to_heads = [&](const OwnedTensor& seq, const schedules::UlyssesLayout& layout,
                        HeadKind kind, const char* what) {
      OwnedTensor heads = device(layout.heads_shape(kind), LiveSet::attention, what);
      schedules::seq_to_heads(seq.view().reshape(layout.seq_shape(kind)), heads, kind, staging,
                              layout, sp, stream_);
      return heads;
    };
    a.q = to_heads(q, U, HeadKind::query, "q (head layout)");
    a.k = to_heads(k, U, HeadKind::kv, "k (head layout)");
    a.v = to_heads(v, Uv, HeadKind::kv, "v (head layout)");
    q.reset();
    k.reset();
    v.reset();
  }
  const Shape q_heads = U.heads_shape(HeadKind::query), k_heads = U.heads_shape(HeadKind::kv);
  const Shape v_heads = Uv.heads_shape(HeadKind::kv), out_heads = Uv.heads_shape(HeadKind::query);
  a.out = device(Shape{N * nh * dv}, LiveSet::attention, "attention output");
  a.lse = OwnedTensor::device(backend_, Shape{B, q_heads[2], T}, ops::attention_lse_dtype(dtype_),
                              LiveSet::attention, "attention lse");
  ops::attention_forward(a.q.view().reshape(q_heads), a.k.view().reshape(k_heads),
                         a.v.view().reshape(v_heads), A.scale, attention_variant(layer, w, batch),
                         a.out.view().reshape(out_heads), a.lse, stream_);
  Tensor attn = a.out.view().reshape(Shape{N, nh * dv});
  if (exchange) {
    a.attn = device(Shape{N, nh * dv}, LiveSet::attention, "attention output (token layout)");
    schedules::heads_to_seq(a.out.view().reshape(out_heads),
                            a.attn.view().reshape(Uv.seq_shape(HeadKind::query)), HeadKind::query,
                            false, staging, Uv, sp, stream_);
    attn = a.attn.view();
  }
  OwnedTensor h = device(Shape{N, H}, LiveSet::workspace, "attention residual");
  ops::linear_forward(attn, w.value(L.o), h, false, stream_);
  ops::add(h, x, h, stream_);
  return h;
}

OwnedTensor DecoderModel::latent_attention_backward(int layer, const Group& w, const Tensor& dh,
                                                    const Tensor& x, const TokenBatch& batch,
                                                    LayerActivations& a) {
  const LayerParamIndex& L = params_.layout().layers[layer];
  const AttentionSpec& A = spec_.layers[layer].attention;
  const schedules::UlyssesLayout& U = ulysses_;
  const schedules::UlyssesLayout Uv = values_layout();
  const int64_t N = x.size(0), H = spec_.hidden;
  const int64_t nh = A.heads, d = A.head_dim, dv = A.value_dim(), dr = A.rope_dim, dn = d - dr;
  const int64_t rkv = A.kv_lora_rank;
  Comm& sp = layout_.sequence();
  const bool exchange = sp.world_size() > 1;
  const Shape q_heads = U.heads_shape(HeadKind::query), k_heads = U.heads_shape(HeadKind::kv);
  const Shape v_heads = Uv.heads_shape(HeadKind::kv), out_heads = Uv.heads_shape(HeadKind::query);
  enter(StepPhase::backward_attention);

  Tensor attn = exchange ? a.attn.view() : a.out.view().reshape(Shape{N, nh * dv});
  OwnedTensor dattn = device(Shape{N, nh * dv}, LiveSet::workspace, "d attention output");
  ops::linear_backward(attn, w.value(L.o), dh, dattn, false, w.grad(L.o), stream_);
  OwnedTensor staging, dout;
  if (exchange) {
    staging = ulysses_staging();
    dout = device(out_heads, LiveSet::workspace, "d attention output (head layout)");
    schedules::seq_to_heads(dattn.view().reshape(Uv.seq_shape(HeadKind::query)), dout,
                            HeadKind::query, staging, Uv, sp, stream_);
    dattn.reset();
  } else {
    dout = std::move(dattn);
  }
  OwnedTensor dq = device(q_heads, LiveSet::workspace, "dq");
  OwnedTensor dk = device(k_heads, LiveSet::workspace, "dk");
  OwnedTensor dvh = device(v_heads, LiveSet::workspace, "dv");
  ops::attention_backward(a.q.view().reshape(q_heads), a.k.view().reshape(k_heads),
                          a.v.view().reshape(v_heads), a.out.view().reshape(out_heads), a.lse,
                          dout.view().reshape(out_heads), A.scale,
                          attention_variant(layer, w, batch), dq, dk, dvh, Tensor(), stream_);
  dout.reset();
  if (exchange) {
    auto to_tokens = [&](OwnedTensor& heads, const schedules::UlyssesLayout& layout, HeadKind kind,
                         int64_t width, const char* what) {
      OwnedTensor seq = device(Shape{N, width}, LiveSet::workspace, what);
      schedules::heads_to_seq(heads, seq.view().reshape(layout.seq_shape(kind)), kind, true,
                              staging, layout, sp, stream_);
      heads.reset();
      return seq;
    };
    dq = to_tokens(dq, U, HeadKind::query, nh * d, "dq (token layout)");
    dk = to_tokens(dk, U, HeadKind::kv, nh * d, "dk (token layout)");
    dvh = to_tokens(dvh, Uv, HeadKind::kv, nh * dv, "dv (token layout)");
  }
  ops::rope_backward(dq.view().reshape(Shape{N, nh, d}), batch.positions, rope_, stream_);

  // The rotary key's gradient: the sum over heads of their rope parts, in head order.
  OwnedTensor dk_rope = device(Shape{N, dr}, LiveSet::workspace, "d rotary key");
  OwnedTensor head_part = device(Shape{N, dr}, LiveSet::workspace, "d rotary key (one head)");
  copy_columns(dk, 0, nh * d, dk_rope, 0, dr, N, dr, stream_);
  for (int64_t h = 1; h < nh; ++h) {
    copy_columns(dk, h * d, nh * d, head_part, 0, dr, N, dr, stream_);
    ops::add(dk_rope, head_part, dk_rope, stream_);
  }
  head_part.reset();
  ops::rope_backward(dk_rope.view().reshape(Shape{N, 1, dr}), batch.positions, rope_, stream_);

  // d kv (N, nh, [nope | v]) from dk's nope parts and dv.
  OwnedTensor dkv = device(Shape{N, nh * (dn + dv)}, LiveSet::workspace, "d kv_b projection");
  copy_columns(dk, dr, d, dkv, 0, dn + dv, N * nh, dn, stream_);
  copy_columns(dvh, 0, dv, dkv, dn, dn + dv, N * nh, dv, stream_);
  dk.reset();
  dvh.reset();
  OwnedTensor dlatent = device(Shape{N, rkv}, LiveSet::workspace, "d kv latent norm");
  ops::linear_backward(a.kv_latent_normed, w.value(L.kv_b), dkv, dlatent, false, w.grad(L.kv_b),
                       stream_);
  dkv.reset();
  // d c = [d c_kv | d k_rope]; the norm's backward in place (ops/rmsnorm.h allows dx = dy).
  ops::rmsnorm_backward(a.kv_latent, w.value(L.kv_a_norm), a.rstd_kv_latent, dlatent, dlatent,
                        w.grad(L.kv_a_norm), stream_);
  OwnedTensor dc = device(Shape{N, rkv + dr}, LiveSet::workspace, "d kv_a projection");
  copy_columns(dlatent, 0, rkv, dc, 0, rkv + dr, N, rkv, stream_);
  copy_columns(dk_rope, 0, dr, dc, rkv, rkv + dr, N, dr, stream_);
  dlatent.reset();
  dk_rope.reset();
  OwnedTensor dn1 = device(Shape{N, H}, LiveSet::workspace, "d input norm");
  ops::linear_backward(a.n1, w.value(L.kv_a), dc, dn1, false, w.grad(L.kv_a), stream_);
  dc.reset();

  // dq back to the Hub's order, then through the query path.
  OwnedTensor dq_hub = device(Shape{N, nh * d}, LiveSet::workspace, "dq (Hub order)");
  copy_columns(dq, 0, d, dq_hub, dn, d, N * nh, dr, stream_);
  copy_columns(dq, dr, d, dq_hub, 0, d, N * nh, dn, stream_);
  dq.reset();
  if (A.q_lora_rank > 0) {
    const int64_t rq = A.q_lora_rank;
    OwnedTensor dq_latent = device(Shape{N, rq}, LiveSet::workspace, "d q latent norm");
    ops::linear_backward(a.q_latent_normed, w.value(L.q_b), dq_hub, dq_latent, false, w.grad(L.q_b),
                         stream_);
    ops::rmsnorm_backward(a.q_latent, w.value(L.q_a_norm), a.rstd_q_latent, dq_latent, dq_latent,
                          w.grad(L.q_a_norm), stream_);
    ops::linear_backward(a.n1, w.value(L.q_a), dq_latent, dn1, true, w.grad(L.q_a), stream_);
  } else {
    ops::linear_backward(a.n1, w.value(L.q), dq_hub, dn1, true, w.grad(L.q), stream_);
  }
  dq_hub.reset();
  OwnedTensor dx = device(Shape{N, H}, LiveSet::workspace, "d layer input");
  ops::rmsnorm_backward(x, w.value(L.input_norm), a.rstd1, dn1, dx, w.grad(L.input_norm), stream_);
  ops::add(dx, dh, dx, stream_);
  return dx;
}

}  // namespace moepeak
