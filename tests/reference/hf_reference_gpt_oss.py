"""The gpt_oss family (config.json model_type "gpt_oss") of the float64 numpy reference
(hf_reference.py): GptOssForCausalLM, written from transformers 5.25.0's modeling_gpt_oss.py,
configuration_gpt_oss.py and masking_utils.py (the MXFP4 integration is not modelled: the
reference reads dequantised float tensors).

Decoder: embed -> L x [x += attn(rms_norm(x)); x += moe(rms_norm(x))] -> rms_norm -> lm_head
(untied in the released configs). Where it differs from Mixtral:
  - attention: q/k/v/o_proj carry biases (.bias) when attention_bias (default true); head_dim is
    its own field (default 64; null -> hidden / heads), scaling head_dim^-0.5; per-head sinks
    self_attn.sinks (heads,): each row's softmax runs over [scores, sink_h] (after subtracting
    the row's max over both) and the sink's column is dropped, so a row's weights sum to < 1;
    layer_types[i] "sliding_attention" sees keys s with t - sliding_window < s <= t
    (masking_utils.sliding_window_overlay on the causal mask), "full_attention" every s <= t.
    layer_types null or absent -> sliding on even layers, full on odd (GptOssConfig); another
    length than num_hidden_layers or another type is an error here, and transformers fails on
    both (validate_layer_type rejects the length; "chunked_attention", say, fails for want of an
    attention_chunk_size). sliding_window null is an error: every GptOssModel forward builds the
    sliding mask, and create_sliding_window_causal_mask raises on it even when no layer slides
    (with use_cache, the cache's sliding layers fail first).
  - RoPE: the family's default rope_parameters is yarn (factor 32, original 4096, beta 32/1,
    truncate false) and default_theta 150000 (hf_reference_rope.py); _apply_rotary_emb's
    half-split form equals rotate_half's.
  - RMSNorm: (w * x_hat).to(dtype) where Mixtral has w * x_hat.to(dtype): no difference in
    float64.
  - router mlp.router.weight (E, H), mlp.router.bias (E,): logits = x W^T + b; top-k of the logits
    (ties to the lower index, see hf_reference_common.top_k); the routing weights are the softmax
    over the k chosen logits (the Mixtral weights renormalised, computed another way).
  - experts, fused in the Hub layout (no conversion mapping for gpt_oss, the Hub names are the
    module's): mlp.experts.gate_up_proj (E, H, 2I) applied as x @ W (not W^T),
    gate_up_proj_bias (E, 2I); gate = columns 0, 2, 4, ..., up = columns 1, 3, 5, ...;
    g = min(gate, limit), u = clamp(up, -limit, limit), h = (u + 1) * g * sigmoid(alpha * g);
    y = h @ down_proj (E, I, H) + down_proj_bias (E, H); y times its routing weight, summed over
    the k (GptOssExperts' eager path). limit = swiglu_limit (default 7.0) and alpha =
    swiglu_alpha (default 1.702; the released configs do not set it) are config fields in 5.25;
    transformers 4.57.6 hard-codes 7.0 and 1.702 and ignores config.json's swiglu_limit, so a
    checkpoint with another limit computes differently there. hidden_act is not read by the
    experts and is ignored here as in transformers.
  - aux loss: GptOssTopKRouter returns (router_logits, scores, indices) and the router logits
    recorded for load_balancing_loss_func are index 0, the raw biased logits x W^T + b, which the
    function softmaxes over all E experts itself and takes the top-k of (hf_reference.
    load_balancing_loss, as the other families). transformers accumulates it in float32
    (router_prob_sum, tokens_per_expert_sum) even for a float64 model.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from hf_reference_common import (FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, config_getter,
                                 shared_config_fields, softmax, top_k)
from hf_reference_rope import resolve_rope

MODEL_TYPE = "gpt_oss"
# GptOssConfig's defaults (transformers 5.25) for the fields this reference reads.
DEFAULTS: Dict[str, Any] = dict(
    vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
    num_attention_heads=64, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
    rms_norm_eps=1e-5, num_experts_per_tok=4, num_experts=128, router_aux_loss_coef=0.001,
    output_router_logits=False, tie_word_embeddings=False, sliding_window=128, layer_types=None,
    attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0)
DEFAULT_THETA = 150000.0  # GptOssConfig.default_theta
# GptOssConfig.__post_init__'s rope_parameters when config.json has none (or null).
DEFAULT_ROPE: Dict[str, Any] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096}
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def config_from_dict(j: Dict[str, Any], where: str) -> ModelConfig:
    """A gpt_oss ModelConfig from a parsed config.json (defaults for missing fields)."""
    get = config_getter(j, DEFAULTS)
    shared = shared_config_fields(j, MODEL_TYPE, DEFAULTS, where)
    hidden, heads, layers = shared["hidden_size"], shared["num_attention_heads"], shared["num_hidden_layers"]
    head_dim = get("head_dim")
    head_dim = hidden // heads if head_dim is None else int(head_dim)  # GptOssConfig.__post_init__
    kv = get("num_key_value_heads")
    kv = heads if kv is None else int(kv)
    layer_types = get("layer_types")
    if layer_types is None:
        layer_types = [SLIDING_ATTENTION if (i + 1) % 2 else FULL_ATTENTION for i in range(layers)]
    layer_types = tuple(layer_types)
    if len(layer_types) != layers:
        raise ValueError(f"{where}: layer_types has {len(layer_types)} entries for {layers} layers")
    other = sorted(set(layer_types) - set(LAYER_TYPES))
    if other:
        raise ValueError(f"{where}: layer_types {other}: gpt_oss has only {', '.join(LAYER_TYPES)}")
    if get("sliding_window") is None:
        raise ValueError(f"{where}: sliding_window is null: transformers' GptOssModel builds the "
                         f"sliding-window mask in every forward and fails on it")
    limit, alpha = get("swiglu_limit"), get("swiglu_alpha")
    if limit is None or alpha is None:
        raise ValueError(f"{where}: swiglu_limit and swiglu_alpha must be numbers")
    intermediate = int(get("intermediate_size"))
    max_pos = shared["max_position_embeddings"]
    return ModelConfig(
        **shared,
        intermediate_size=intermediate,
        moe_intermediate_size=intermediate,
        num_key_value_heads=kv,
        head_dim=head_dim,
        sliding_window=int(get("sliding_window")),
        layer_types=layer_types,
        moe_layer_flags=(True,) * layers,
        norm_topk_prob=True,  # softmax over the k chosen logits
        attention_bias=bool(get("attention_bias")),
        qk_norm=False,
        rope=resolve_rope(j, MODEL_TYPE, head_dim, head_dim, max_pos, where, DEFAULT_THETA, DEFAULT_ROPE),
        attention_sinks=True,
        swiglu_alpha=float(alpha),
        swiglu_limit=float(limit),
    )


def mlp_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's MoE tensors (Hub names) and their shapes: router weight and bias, then the fused
    experts."""
    p = f"model.layers.{i}.mlp."
    h, f, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    return {p + "router.weight": (e, h), p + "router.bias": (e,),
            p + "experts.gate_up_proj": (e, h, 2 * f), p + "experts.gate_up_proj_bias": (e, 2 * f),
            p + "experts.down_proj": (e, f, h), p + "experts.down_proj_bias": (e, h)}


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), written with tanh so that no exp overflows for large |x|."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def clamped_swiglu(gate_up: np.ndarray, cfg: ModelConfig) -> Tuple[np.ndarray, np.ndarray]:
    """GptOssExperts._apply_gate: gate_up (n, 2I) interleaved [g0, u0, g1, u1, ...] -> (n, I), and
    which entries the clamps hold ((n, 2I) bool: gate > limit, |up| > limit)."""
    gate, up = gate_up[:, 0::2], gate_up[:, 1::2]
    limit = cfg.swiglu_limit
    clamped = np.concatenate([gate > limit, np.abs(up) > limit], axis=1)
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    glu = gate * sigmoid(gate * cfg.swiglu_alpha)
    return (up + 1.0) * glu, clamped


def mlp(x: np.ndarray, params: Dict[str, np.ndarray], i: int, cfg: ModelConfig
        ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layer i's GptOssMLP: x (B, T, H) normalised -> (output (B, T, H), router logits
    (B*T, E) = x W^T + b, selected experts (B*T, k), which activations the clamps hold (flat
    bool, expert by expert)).

    NOTES: the fused expert tensors are applied as x @ W (gate_up_proj[e] is (H, 2I),
    down_proj[e] is (I, H)), not nn.Linear's x @ W^T; gate and up interleave along 2I.
    """
    p = f"model.layers.{i}.mlp."
    B, T, H = x.shape
    x = x.reshape(B * T, H)
    router_logits = x @ params[p + "router.weight"].T + params[p + "router.bias"]  # (N, E)
    selected = top_k(router_logits, cfg.num_experts_per_tok)                        # (N, k)
    weights = softmax(np.take_along_axis(router_logits, selected, axis=-1), axis=-1)  # (N, k)
    gate_up_w, gate_up_b = params[p + "experts.gate_up_proj"], params[p + "experts.gate_up_proj_bias"]
    down_w, down_b = params[p + "experts.down_proj"], params[p + "experts.down_proj_bias"]
    out = np.zeros((B * T, H), dtype=x.dtype)
    clamped = []
    for e in range(cfg.num_experts):
        tokens, slot = np.nonzero(selected == e)
        if tokens.size == 0:
            continue
        gate_up = x[tokens] @ gate_up_w[e] + gate_up_b[e]   # (n, 2I)
        h, clamped_e = clamped_swiglu(gate_up, cfg)
        ye = h @ down_w[e] + down_b[e]                       # (n, H)
        out[tokens] += ye * weights[tokens, slot][:, None]  # index_add_ of the weighted outputs
        clamped.append(clamped_e.ravel())
    clamped_all = np.concatenate(clamped) if clamped else np.zeros(0, dtype=bool)
    return out.reshape(B, T, H), router_logits, selected, clamped_all
