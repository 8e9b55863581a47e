"""The mixtral family (config.json model_type "mixtral", or no model_type) of the float64 numpy
reference (hf_reference.py): MixtralForCausalLM, written from modeling_mixtral.py and
configuration_mixtral.py (transformers 5.25.0, compared with 4.51.0, 4.57.6 and 5.0 to 5.10).

Every layer is MoE: router softmax over all experts, top-k with ties to the lower index, the k
weights always renormalised to sum 1, silu-gated experts (hf_reference_common.softmax_topk_moe);
no attention biases, no q/k norms; head_dim from config.json or hidden / heads; an optional
sliding_window on every layer. Hub tensor names: model.layers.{i}.block_sparse_moe.gate.weight
(E, H) and ...block_sparse_moe.experts.{e}.w1/w3/w2.weight (gate (I, H), up (I, H), down (H, I)).

Expert tensor names. transformers 5 keeps each layer's experts fused in the module
(mlp.experts.gate_up_proj (E, 2*I, H) = per expert cat([w1, w3], dim 0), mlp.experts.down_proj
(E, H, I); block_sparse_moe is renamed mlp), but conversion_mapping.py converts on load from the
per-expert Hub names above (block_sparse_moe -> mlp, experts.*.w1/w3 -> gate_up_proj,
experts.*.w2 -> down_proj), and save_pretrained reverts it: checkpoints saved by transformers
5.25 carry the per-expert Hub names (checked). This reference takes the per-expert Hub names only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from hf_reference_common import (FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, config_getter,
                                 shared_config_fields, softmax_topk_moe)
from hf_reference_rope import resolve_rope

MODEL_TYPE = "mixtral"
# MixtralConfig's defaults (transformers 5.25) for the fields this reference reads.
DEFAULTS: Dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
    rms_norm_eps=1e-5, num_experts_per_tok=2, num_experts=8, router_aux_loss_coef=0.001,
    output_router_logits=False, tie_word_embeddings=False, sliding_window=None, hidden_act="silu")
DEFAULT_THETA = 1e6  # MixtralConfig.default_theta


def config_from_dict(j: Dict[str, Any], where: str) -> ModelConfig:
    """A mixtral ModelConfig from a parsed config.json (defaults for missing fields)."""
    get = config_getter(j, DEFAULTS)
    if get("hidden_act") != "silu":
        raise ValueError(f"{where}: hidden_act {get('hidden_act')!r}: only silu is implemented")
    shared = shared_config_fields(j, MODEL_TYPE, DEFAULTS, where)
    hidden, heads, layers = shared["hidden_size"], shared["num_attention_heads"], shared["num_hidden_layers"]
    # MixtralConfig: head_dim defaults to None; the attention uses head_dim or hidden // heads.
    head_dim_attr = j.get("head_dim")
    head_dim = int(head_dim_attr or hidden // heads)
    kv = j.get("num_key_value_heads", DEFAULTS["num_key_value_heads"])
    kv = heads if kv is None else int(kv)  # MixtralConfig.__post_init__
    sliding_window: Optional[int] = j.get("sliding_window")
    intermediate = int(get("intermediate_size"))
    max_pos = shared["max_position_embeddings"]
    return ModelConfig(
        **shared,
        intermediate_size=intermediate,
        moe_intermediate_size=intermediate,
        num_key_value_heads=kv,
        head_dim=head_dim,
        sliding_window=None if sliding_window is None else int(sliding_window),
        layer_types=(SLIDING_ATTENTION if sliding_window is not None else FULL_ATTENTION,) * layers,
        moe_layer_flags=(True,) * layers,
        norm_topk_prob=True,
        attention_bias=False,
        qk_norm=False,
        rope=resolve_rope(j, MODEL_TYPE, head_dim, head_dim_attr, max_pos, where, DEFAULT_THETA),
    )


def moe_names(cfg: ModelConfig, i: int) -> Tuple[str, List[Tuple[str, str, str]]]:
    """Layer i's Hub tensor names: the router weight (E, H), and per expert (gate (I, H),
    up (I, H), down (H, I))."""
    p = f"model.layers.{i}.block_sparse_moe."
    return p + "gate.weight", [(f"{p}experts.{e}.w1.weight", f"{p}experts.{e}.w3.weight",
                                f"{p}experts.{e}.w2.weight") for e in range(cfg.num_experts)]


def mlp_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's MoE tensors and their shapes, router first, then expert by expert."""
    router, experts = moe_names(cfg, i)
    h, f = cfg.hidden_size, cfg.moe_intermediate_size
    shapes = {router: (cfg.num_experts, h)}
    for g, u, dn in experts:
        shapes[g] = (f, h)
        shapes[u] = (f, h)
        shapes[dn] = (h, f)
    return shapes


def mlp(x: np.ndarray, params: Dict[str, np.ndarray], i: int, cfg: ModelConfig
        ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray], None]:
    """Layer i's MixtralSparseMoeBlock: x (B, T, H) -> (output (B, T, H), router logits (B*T, E),
    selected experts (B*T, k), None: no clamps)."""
    router, experts = moe_names(cfg, i)
    B, T, H = x.shape
    out, router_logits, selected = softmax_topk_moe(x.reshape(B * T, H), params, router, experts, cfg)
    return out.reshape(B, T, H), router_logits, selected, None
