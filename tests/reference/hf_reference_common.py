"""What the families of the float64 numpy reference (hf_reference.py) share: the config every
config.json resolves to (ModelConfig), the forward's result, and the layers that more than one
family uses: RMSNorm, linear, the GQA softmax attention with its options (q/k/v/o biases, per-head
q/k norms, a causal sliding window per layer, per-head sinks), and the softmax-then-top-k sparse
MoE block of Mixtral and Qwen3-MoE. Everything in float64; numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from hf_reference_rope import RopeParameters, apply_rope

IGNORE_INDEX = -100
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass
class ModelConfig:
    """One model's config.json as transformers reads it, every family in one shape."""
    model_type: str                     # "mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "kimi_k2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int              # mixtral, gpt_oss: each expert's width; qwen3_moe: dense MLP width
    moe_intermediate_size: int          # each expert's width (mixtral, gpt_oss: = intermediate_size)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    max_position_embeddings: int
    rms_norm_eps: float
    router_aux_loss_coef: float
    output_router_logits: bool
    tie_word_embeddings: bool
    sliding_window: Optional[int]       # the window of the "sliding_attention" layers
    layer_types: Tuple[str, ...]        # per layer: FULL_ATTENTION or SLIDING_ATTENTION
    moe_layer_flags: Tuple[bool, ...]   # per layer: a sparse MoE block (else a dense MLP)
    norm_topk_prob: bool                # renormalise the k routing weights (mixtral: always)
    attention_bias: bool                # q/k/v/o_proj biases (mixtral: never; gpt_oss: default on)
    qk_norm: bool                       # per-head q_norm / k_norm (qwen3_moe)
    rope: RopeParameters
    attention_sinks: bool = False       # per-head self_attn.sinks (gpt_oss)
    swiglu_alpha: Optional[float] = None  # gpt_oss's experts: h = (u + 1) * g * sigmoid(alpha * g)
    swiglu_limit: Optional[float] = None  # gpt_oss's experts: g <= limit, |u| <= limit
    mlp_only_layers: Tuple[int, ...] = ()  # qwen3_moe: layers forced dense
    decoder_sparse_step: int = 1        # qwen3_moe: every step-th layer is MoE
    # What only one family reads (deepseek_v3 / kimi_k2: hf_reference_deepseek_v3.DeepseekFields,
    # MLA and group-limited routing); None for the others.
    family_fields: Any = None

    @property
    def num_local_experts(self) -> int:
        """Mixtral's and gpt-oss's name for num_experts."""
        return self.num_experts

    @property
    def rope_theta(self) -> float:
        return self.rope.rope_theta

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i has a sparse MoE block."""
        return self.moe_layer_flags[i]

    @property
    def moe_layers(self) -> List[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    def attention_window(self, i: int) -> Optional[int]:
        """Layer i's sliding window W (key s visible to query t iff t - W < s <= t), or None for
        plain causal attention."""
        return self.sliding_window if self.layer_types[i] == SLIDING_ATTENTION else None


@dataclass
class ForwardResult:
    logits: np.ndarray                  # (B, T, V)
    router_logits: List[np.ndarray]     # per MoE layer, (B*T, E): what the aux loss receives
    selected_experts: List[np.ndarray]  # per MoE layer, (B*T, k)
    # per MoE layer with clamped activations (gpt_oss), which of them the clamps hold: the loss
    # has a kink wherever one of these flips, as it has one wherever a selection changes.
    clamped: List[np.ndarray] = field(default_factory=list)


def config_getter(j: Dict[str, Any], defaults: Dict[str, Any]) -> Callable[[str], Any]:
    """get(key): config.json's value, else the family's transformers 5.25 default."""
    return lambda key: j.get(key, defaults[key])


def shared_config_fields(j: Dict[str, Any], model_type: str, defaults: Dict[str, Any],
                         where: str) -> Dict[str, Any]:
    """The ModelConfig fields every family reads the same way, with the family's defaults for
    missing ones. transformers 5 checks JSON types strictly (@strict dataclasses: 0 for a float
    field, 256.0 for an int field, 1 for a bool are load errors there); this reference converts."""
    get = config_getter(j, defaults)
    # num_experts / num_local_experts: each config maps one onto the other (attribute_map).
    experts = [j[k] for k in ("num_experts", "num_local_experts") if k in j]
    if len(experts) == 2 and experts[0] != experts[1]:
        raise ValueError(f"{where}: num_experts {experts[0]} and num_local_experts {experts[1]} differ")
    return dict(
        model_type=model_type,
        vocab_size=int(get("vocab_size")),
        hidden_size=int(get("hidden_size")),
        num_hidden_layers=int(get("num_hidden_layers")),
        num_attention_heads=int(get("num_attention_heads")),
        num_experts=int(experts[0] if experts else defaults["num_experts"]),
        num_experts_per_tok=int(get("num_experts_per_tok")),
        max_position_embeddings=int(get("max_position_embeddings")),
        rms_norm_eps=float(get("rms_norm_eps")),
        router_aux_loss_coef=float(get("router_aux_loss_coef")),
        output_router_logits=bool(get("output_router_logits")),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
    )


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """MixtralRMSNorm / Qwen3MoeRMSNorm / GptOssRMSNorm: x * 1/sqrt(mean(x^2) + eps) * w, over the
    last axis. (transformers normalises in float32, then Mixtral and Qwen3 cast x_hat back before
    the weight, gpt-oss casts w * x_hat: the same in float64.)"""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def linear(x: np.ndarray, params: Dict[str, np.ndarray], name: str, bias: bool) -> np.ndarray:
    """nn.Linear: x @ W^T (+ b). name: the module, e.g. "...self_attn.q_proj"."""
    y = x @ params[name + ".weight"].T
    return y + params[name + ".bias"] if bias else y


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, largest first; ties go to the lower index.

    NOTES: torch.topk promises no order among equal values (torch 2.15 on CPU:
    topk([0, 1, 1, 0.5, 1], 2) gives indices [2, 4]); moepeak's router breaks ties to the lower
    index, and so does this reference. Exact ties do not occur with continuous random weights, and
    check_step_dump.py skips the finite differences that change a selection.
    """
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def attention_allowed(T: int, window: Optional[int] = None,
                      document_starts: Optional[np.ndarray] = None) -> np.ndarray:
    """Which keys each query sees: causal (T, T), within the last `window` keys when given, and
    with packed documents only the keys of its own document — document_starts (B, T): the first
    position of each position's document (moepeak's step dump; transformers packs with
    position_ids into varlen attention) — then (B, 1, T, T)."""
    qi = np.arange(T)[:, None]
    ki = np.arange(T)[None, :]
    allowed = ki <= qi
    if window is not None:
        allowed &= ki > qi - int(window)  # transformers' sliding_window_overlay
    if document_starts is not None:
        starts = np.asarray(document_starts, dtype=np.int64)[:, None, :, None]  # (B, 1, Tq, 1)
        allowed = allowed[None, None] & (ki[None, None] >= starts)
    return allowed


def attention(x: np.ndarray, params: Dict[str, np.ndarray], layer: int, cfg: ModelConfig,
              cos: np.ndarray, sin: np.ndarray,
              document_starts: Optional[np.ndarray] = None) -> np.ndarray:
    """Layer `layer`'s MixtralAttention / Qwen3MoeAttention / GptOssAttention (eager): x (B, T, H)
    already normalised -> o_proj output (B, T, H). document_starts: see attention_allowed."""
    prefix = f"model.layers.{layer}.self_attn."
    B, T, _ = x.shape
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bias = cfg.attention_bias
    q = linear(x, params, prefix + "q_proj", bias)  # (B, T, nh*d)
    k = linear(x, params, prefix + "k_proj", bias)  # (B, T, nkv*d)
    v = linear(x, params, prefix + "v_proj", bias)
    q = q.reshape(B, T, nh, d)
    k = k.reshape(B, T, nkv, d)
    if cfg.qk_norm:  # Qwen3: RMSNorm over each head's d features, before RoPE
        q = rms_norm(q, params[prefix + "q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, params[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    q = q.transpose(0, 2, 1, 3)                        # (B, nh, T, d)
    k = k.transpose(0, 2, 1, 3)                        # (B, nkv, T, d)
    v = v.reshape(B, T, nkv, d).transpose(0, 2, 1, 3)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    # repeat_kv: query head h reads kv head h // (nh / nkv).
    groups = nh // nkv
    k = np.repeat(k, groups, axis=1)  # (B, nh, T, d); kv head j serves query heads j*g..j*g+g-1
    v = np.repeat(v, groups, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(d))  # (B, nh, Tq, Tk)
    allowed = attention_allowed(T, cfg.attention_window(layer), document_starts)
    scores = np.where(allowed, scores, -np.inf)
    if cfg.attention_sinks:
        # gpt-oss: each row's softmax runs over [scores, sink_h]; the sink's column is dropped.
        sinks = params[prefix + "sinks"]  # (nh,)
        sink_column = np.broadcast_to(sinks[None, :, None, None], (B, nh, T, 1))
        scores = np.concatenate([scores, sink_column], axis=-1)  # (B, nh, Tq, Tk + 1)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    if cfg.attention_sinks:
        probs = probs[..., :-1]
    out = probs @ v                                       # (B, nh, T, d)
    out = out.transpose(0, 2, 1, 3).reshape(B, T, nh * d)
    return linear(out, params, prefix + "o_proj", bias)


def softmax_topk_moe(x: np.ndarray, params: Dict[str, np.ndarray], router: str,
                     experts: List[Tuple[str, str, str]], cfg: ModelConfig
                     ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: x (N, H) normalised tokens; router: the
    router weight's name (E, H); experts: per expert the names of gate (I, H), up (I, H), down
    (H, I). Returns (output (N, H), router logits (N, E), selected experts (N, k)).

    Router softmax over all experts, top-k of the probabilities, the k weights renormalised to
    sum 1 when cfg.norm_topk_prob; each chosen expert's silu-gated MLP times its weight, summed.
    """
    N, H = x.shape
    router_logits = x @ params[router].T                       # (N, E)
    routing = softmax(router_logits, axis=-1)                  # over all experts
    selected = top_k(routing, cfg.num_experts_per_tok)         # (N, k)
    weights = np.take_along_axis(routing, selected, axis=-1)   # (N, k)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)  # renormalise the k to sum 1
    out = np.zeros((N, H), dtype=x.dtype)
    for e, (w_gate, w_up, w_down) in enumerate(experts):
        tokens, slot = np.nonzero(selected == e)
        if tokens.size == 0:
            continue
        w1 = params[w_gate]  # (I, H)
        w2 = params[w_down]  # (H, I)
        w3 = params[w_up]    # (I, H)
        xe = x[tokens]
        ye = (silu(xe @ w1.T) * (xe @ w3.T)) @ w2.T
        out[tokens] += ye * weights[tokens, slot][:, None]  # index_add_ of the weighted outputs
    return out, router_logits, selected
