"""The qwen3_moe family (config.json model_type "qwen3_moe") of the float64 numpy reference
(hf_reference.py): Qwen3MoeForCausalLM, written from modular/modeling/configuration_qwen3_moe.py
(transformers 5.25.0, compared with 4.51.0, 4.57.6 and 5.0 to 5.10).

q and k get a per-head RMSNorm over head_dim (self_attn.q_norm.weight, self_attn.k_norm.weight:
(head_dim,), eps rms_norm_eps) after the projection and before RoPE; head_dim is its own field
(hidden / heads when absent); q/k/v/o_proj carry biases (.bias) when attention_bias is true. Layer
i is MoE when `i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step ==
0` (Qwen3MoeDecoderLayer), otherwise a dense MLP mlp.{gate,up,down}_proj.weight of width
intermediate_size. MoE layers: router mlp.gate.weight (E, H), experts
mlp.experts.{e}.{gate,up,down}_proj.weight of width moe_intermediate_size, routed as Mixtral's
(hf_reference_common.softmax_topk_moe) except that the top-k weights are renormalised only when
norm_topk_prob. The sliding window applies (to every layer) only when use_sliding_window.

Expert tensor names. transformers 5 keeps each layer's experts fused in the module
(mlp.experts.gate_up_proj (E, 2*I, H) = per expert cat([gate_proj, up_proj], dim 0),
mlp.experts.down_proj (E, H, I)), but conversion_mapping.py converts on load from the per-expert
Hub names above (the "qwen2_moe" mapping: mlp.experts.*.gate_proj/up_proj.weight ->
MergeModulelist(dim=0) + Concatenate(dim=1) -> gate_up_proj; mlp.experts.*.down_proj.weight ->
down_proj), and save_pretrained reverts it: checkpoints saved by transformers 5.25 carry the
per-expert Hub names (checked). This reference takes the per-expert Hub names only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from hf_reference_common import (FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, config_getter,
                                 shared_config_fields, silu, softmax_topk_moe)
from hf_reference_rope import resolve_rope

MODEL_TYPE = "qwen3_moe"
# Qwen3MoeConfig's defaults (transformers 5.25) for the fields this reference reads.
DEFAULTS: Dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
    num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
    num_experts_per_tok=8, num_experts=128, router_aux_loss_coef=0.001, output_router_logits=False,
    tie_word_embeddings=False, sliding_window=4096, use_sliding_window=False, attention_bias=False,
    decoder_sparse_step=1, moe_intermediate_size=768, norm_topk_prob=False, mlp_only_layers=None,
    hidden_act="silu")
DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta


def config_from_dict(j: Dict[str, Any], where: str) -> ModelConfig:
    """A qwen3_moe ModelConfig from a parsed config.json (defaults for missing fields)."""
    get = config_getter(j, DEFAULTS)
    if get("hidden_act") != "silu":
        raise ValueError(f"{where}: hidden_act {get('hidden_act')!r}: only silu is implemented")
    shared = shared_config_fields(j, MODEL_TYPE, DEFAULTS, where)
    hidden, heads, layers = shared["hidden_size"], shared["num_attention_heads"], shared["num_hidden_layers"]
    # Qwen3MoeConfig has no head_dim field: getattr(config, "head_dim", hidden // heads).
    if "head_dim" in j and j["head_dim"] is None:
        raise ValueError(f"{where}: head_dim is null; qwen3_moe needs an integer or no head_dim")
    head_dim = int(j.get("head_dim", hidden // heads))
    if get("num_key_value_heads") is None:
        raise ValueError(f"{where}: num_key_value_heads is null")
    sliding_window = get("sliding_window") if get("use_sliding_window") else None
    mlp_only_layers = tuple(int(i) for i in (get("mlp_only_layers") or []))
    decoder_sparse_step = int(get("decoder_sparse_step"))
    try:  # Qwen3MoeDecoderLayer's condition, short-circuits included
        moe_layer_flags = tuple((i not in mlp_only_layers) and (
            shared["num_experts"] > 0 and (i + 1) % decoder_sparse_step == 0) for i in range(layers))
    except ZeroDivisionError:
        raise ValueError(f"{where}: decoder_sparse_step = 0: transformers divides by it") from None
    max_pos = shared["max_position_embeddings"]
    return ModelConfig(
        **shared,
        intermediate_size=int(get("intermediate_size")),
        moe_intermediate_size=int(get("moe_intermediate_size")),
        num_key_value_heads=int(get("num_key_value_heads")),
        head_dim=head_dim,
        sliding_window=None if sliding_window is None else int(sliding_window),
        layer_types=(SLIDING_ATTENTION if sliding_window is not None else FULL_ATTENTION,) * layers,
        moe_layer_flags=moe_layer_flags,
        norm_topk_prob=bool(get("norm_topk_prob")),
        attention_bias=bool(get("attention_bias")),
        qk_norm=True,
        rope=resolve_rope(j, MODEL_TYPE, head_dim, head_dim, max_pos, where, DEFAULT_THETA),
        mlp_only_layers=mlp_only_layers,
        decoder_sparse_step=decoder_sparse_step,
    )


def moe_names(cfg: ModelConfig, i: int) -> Tuple[str, List[Tuple[str, str, str]]]:
    """MoE layer i's Hub tensor names: the router weight (E, H), and per expert (gate (I, H),
    up (I, H), down (H, I))."""
    p = f"model.layers.{i}.mlp."
    return p + "gate.weight", [(f"{p}experts.{e}.gate_proj.weight", f"{p}experts.{e}.up_proj.weight",
                                f"{p}experts.{e}.down_proj.weight") for e in range(cfg.num_experts)]


def mlp_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's MLP tensors and their shapes: the MoE router then expert by expert, or the dense
    MLP's gate, up, down."""
    h = cfg.hidden_size
    if not cfg.is_moe_layer(i):
        p, f = f"model.layers.{i}.mlp.", cfg.intermediate_size
        return {p + "gate_proj.weight": (f, h), p + "up_proj.weight": (f, h), p + "down_proj.weight": (h, f)}
    router, experts = moe_names(cfg, i)
    f = cfg.moe_intermediate_size
    shapes = {router: (cfg.num_experts, h)}
    for g, u, dn in experts:
        shapes[g] = (f, h)
        shapes[u] = (f, h)
        shapes[dn] = (h, f)
    return shapes


def dense_mlp(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """Qwen3MoeMLP: down_proj(silu(gate_proj(x)) * up_proj(x)); x (..., H)."""
    g = x @ params[prefix + "gate_proj.weight"].T
    u = x @ params[prefix + "up_proj.weight"].T
    return (silu(g) * u) @ params[prefix + "down_proj.weight"].T


def mlp(x: np.ndarray, params: Dict[str, np.ndarray], i: int, cfg: ModelConfig
        ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray], None]:
    """Layer i's Qwen3MoeSparseMoeBlock or Qwen3MoeMLP: x (B, T, H) -> (output (B, T, H), router
    logits (B*T, E) or None, selected experts (B*T, k) or None, None: no clamps)."""
    if not cfg.is_moe_layer(i):
        return dense_mlp(x, params, f"model.layers.{i}.mlp."), None, None, None
    router, experts = moe_names(cfg, i)
    B, T, H = x.shape
    out, router_logits, selected = softmax_topk_moe(x.reshape(B * T, H), params, router, experts, cfg)
    return out.reshape(B, T, H), router_logits, selected, None
