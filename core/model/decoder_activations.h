// DecoderModel::LayerActivations: what one decoder layer keeps from its forward for its backward
// (private to the decoder's translation units: decoder.cpp, decoder_latent_attention.cpp).
#pragma once

#include "core/model/decoder.h"
#include "ops/schedules/dispatch.h"

namespace moepeak {

// q, k, v, out and lse are in the head layout of the attention (B, T, h_r, d) (with W = 1 that is
// the token layout; v and out of value heads dv = AttentionSpec::value_dim()); attn is the
// attention output back in this rank's token layout, kept for o_proj's backward (W > 1 only).
struct DecoderModel::LayerActivations {
  OwnedTensor n1, rstd1;                     // input norm (N, H), (N)
  OwnedTensor q_pre, k_pre, rstd_q, rstd_k;  // qk_norm: q, k before it (N, nh*d), (N, nkv*d);
                                             // rstd (N*nh), (N*nkv)
  // Latent attention: the query bottleneck before and after its norm (N, r_q) x2 and the norm's
  // rstd (N) (q_lora_rank > 0); the key/value latent before and after its norm (N, r_kv) x2, its
  // rstd (N).
  OwnedTensor q_latent, q_latent_normed, rstd_q_latent;
  OwnedTensor kv_latent, kv_latent_normed, rstd_kv_latent;
  OwnedTensor q, k, v;                            // (B, T, hq_r, d), (B, T, hkv_r, d), (.., dv)
  OwnedTensor out, lse;                           // (B, T, hq_r, dv), (B, hq_r, T)
  OwnedTensor attn;                               // (N, nh*dv) when W > 1
  OwnedTensor h;                                  // (N, H) x + o_proj(attn)
  OwnedTensor n2, rstd2;                          // post-attention norm (N, H), (N)
  OwnedTensor probs, topk_index, topk_weight;     // MoE: (N, E), (N, k) i32, (N, k)
  OwnedTensor mlp_gate, mlp_up;                   // dense: gate and up projections (N, I) x2
  OwnedTensor shared_gate, shared_up;             // shared experts: (N, Is) x2
  schedules::ExpertDispatch* dispatch = nullptr;  // the layer's, in DecoderModel::dispatchers_

  void release() {
    for (OwnedTensor* t : {&n1,
                           &rstd1,
                           &q_pre,
                           &k_pre,
                           &rstd_q,
                           &rstd_k,
                           &q_latent,
                           &q_latent_normed,
                           &rstd_q_latent,
                           &kv_latent,
                           &kv_latent_normed,
                           &rstd_kv_latent,
                           &q,
                           &k,
                           &v,
                           &out,
                           &lse,
                           &attn,
                           &h,
                           &n2,
                           &rstd2,
                           &probs,
                           &topk_index,
                           &topk_weight,
                           &mlp_gate,
                           &mlp_up,
                           &shared_gate,
                           &shared_up}) {
      t->reset();
    }
    if (dispatch) dispatch->release();
  }
};

}  // namespace moepeak
