"""An independent float64 numpy reference of Hugging Face's MixtralForCausalLM forward and loss.

Written from transformers' modeling_mixtral.py semantics (docs/design.md#the-model), sharing no code
with moepeak, so that tests/reference/check_step_dump.py can check moepeak's step-1 loss and
gradients against it:

    params = load_params("dump/model.safetensors")      # name -> float64 array, HF tensor names
    cfg = read_config("dump/config.json")               # MixtralConfig fields
    batch = read_safetensors("dump/batch.safetensors")  # input_ids, labels: int64 (B, T)
    value = loss(params, cfg, batch["input_ids"], batch["labels"])

Everything is computed in float64 (moepeak computes in float32), so the reference is the more
exact of the two. Only numpy and the standard library are used.

Labels follow moepeak's step dump: labels[b, t] is already the target of position t (the next
token), and -100 marks an ignored position. transformers' ForCausalLMLoss would shift labels by
one itself; here they are NOT shifted again.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

IGNORE_INDEX = -100

# ---------------------------------------------------------------------------------------------
# safetensors and config.json
# ---------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "F16": "<f2",
                       "BF16": "<u2"}


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they are (the top half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Reads a .safetensors file: u64 little-endian header length, JSON header, raw data.

    Each header entry is {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative
    to the first byte after the header. "__metadata__" is skipped. Returns read-only arrays;
    BF16 tensors come back as the float32 values they hold.
    """
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    tensors: Dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name}: dtype {entry['dtype']} is not supported here")
        begin, end = entry["data_offsets"]
        shape = tuple(int(s) for s in entry["shape"])
        array = np.frombuffer(data[begin:end], dtype=dtype)
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {array.size} elements for shape {shape}")
        if entry["dtype"] == "BF16":
            array = bf16_bits_to_float32(array)
        tensors[name] = array.reshape(shape)
    return tensors


@dataclass
class MixtralConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_local_experts: int
    num_experts_per_tok: int
    rope_theta: float
    rms_norm_eps: float
    router_aux_loss_coef: float
    output_router_logits: bool
    tie_word_embeddings: bool
    sliding_window: Optional[int]


def read_config(path: str) -> MixtralConfig:
    """Reads a MixtralConfig config.json, with transformers' defaults for the optional fields."""
    with open(path, "r", encoding="utf-8") as f:
        j = json.load(f)
    if j.get("model_type", "mixtral") != "mixtral":
        raise ValueError(f"{path}: model_type {j.get('model_type')!r} is not mixtral")
    if j.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{path}: hidden_act {j.get('hidden_act')!r}: only silu is implemented")
    if j.get("rope_scaling") not in (None, {}):
        raise ValueError(f"{path}: rope_scaling is not implemented by this reference")
    # transformers 5 keeps theta in rope_parameters (and may drop the top-level key).
    rope_parameters = j.get("rope_parameters") or {}
    if rope_parameters.get("rope_type", "default") != "default":
        raise ValueError(f"{path}: rope_parameters.rope_type is not implemented by this reference")
    rope_theta = j.get("rope_theta", rope_parameters.get("rope_theta", 1e6))
    head_dim = j.get("head_dim") or j["hidden_size"] // j["num_attention_heads"]
    return MixtralConfig(
        vocab_size=int(j["vocab_size"]),
        hidden_size=int(j["hidden_size"]),
        intermediate_size=int(j["intermediate_size"]),
        num_hidden_layers=int(j["num_hidden_layers"]),
        num_attention_heads=int(j["num_attention_heads"]),
        num_key_value_heads=int(j.get("num_key_value_heads") or j["num_attention_heads"]),
        head_dim=int(head_dim),
        num_local_experts=int(j["num_local_experts"]),
        num_experts_per_tok=int(j["num_experts_per_tok"]),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(j.get("rms_norm_eps", 1e-5)),
        router_aux_loss_coef=float(j.get("router_aux_loss_coef", 0.001)),
        output_router_logits=bool(j.get("output_router_logits", False)),
        tie_word_embeddings=bool(j.get("tie_word_embeddings", False)),
        sliding_window=j.get("sliding_window"),
    )


def load_params(path: str) -> Dict[str, np.ndarray]:
    """The weights of a safetensors file, or of a Hugging Face model directory (model.safetensors,
    or the files model.safetensors.index.json maps), as writable float64 arrays keyed by HF
    tensor name."""
    if not os.path.isdir(path):
        return {name: np.array(t, dtype=np.float64) for name, t in read_safetensors(path).items()}
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_params(os.path.join(path, "model.safetensors"))
    with open(index, "r", encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    params: Dict[str, np.ndarray] = {}
    for file in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(path, file)).items():
            if weight_map.get(name) != file:
                raise ValueError(f"{path}: {file} holds {name}, which the index does not put there")
            params[name] = np.array(t, dtype=np.float64)
    missing = set(weight_map) - set(params)
    if missing:
        raise ValueError(f"{path}: the index names tensors no file holds: {sorted(missing)[:3]}")
    return params


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """MixtralRMSNorm: x * 1/sqrt(mean(x^2) + eps) * w, over the last axis."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def rope_cos_sin(seq_len: int, head_dim: int, theta: float) -> Tuple[np.ndarray, np.ndarray]:
    """MixtralRotaryEmbedding (default rope type): cos and sin, (T, head_dim).

    inv_freq[i] = theta^(-2i/d) for i in 0..d/2-1; freqs = position * inv_freq; emb = cat(freqs,
    freqs) along the last axis (the two halves repeat, matching rotate_half).
    """
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    positions = np.arange(seq_len, dtype=np.float64)  # 0..T-1 in every sequence
    freqs = np.outer(positions, inv_freq)                # (T, d/2)
    emb = np.concatenate([freqs, freqs], axis=-1)        # (T, d)
    return np.cos(emb), np.sin(emb)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """transformers' rotate_half: (x1, x2) -> (-x2, x1), halves along the last axis."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([-x2, x1], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin. x: (B, heads, T, d)."""
    return x * cos + rotate_half(x) * sin


def attention(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str, cfg: MixtralConfig,
              cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """MixtralAttention (eager): x (B, T, H) already normalised -> o_proj output (B, T, H)."""
    B, T, _ = x.shape
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = x @ params[prefix + "q_proj.weight"].T  # (B, T, nh*d); nn.Linear: x @ W^T, no bias
    k = x @ params[prefix + "k_proj.weight"].T  # (B, T, nkv*d)
    v = x @ params[prefix + "v_proj.weight"].T
    q = q.reshape(B, T, nh, d).transpose(0, 2, 1, 3)   # (B, nh, T, d)
    k = k.reshape(B, T, nkv, d).transpose(0, 2, 1, 3)  # (B, nkv, T, d)
    v = v.reshape(B, T, nkv, d).transpose(0, 2, 1, 3)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    # repeat_kv: query head h reads kv head h // (nh / nkv).
    groups = nh // nkv
    k = np.repeat(k, groups, axis=1)  # (B, nh, T, d); kv head j serves query heads j*g..j*g+g-1
    v = np.repeat(v, groups, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(d))  # (B, nh, Tq, Tk)
    qi = np.arange(T)[:, None]
    ki = np.arange(T)[None, :]
    allowed = ki <= qi  # causal
    if cfg.sliding_window is not None:
        allowed &= ki > qi - int(cfg.sliding_window)  # transformers' sliding-window overlay
    scores = np.where(allowed, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    out = probs @ v                                       # (B, nh, T, d)
    out = out.transpose(0, 2, 1, 3).reshape(B, T, nh * d)
    return out @ params[prefix + "o_proj.weight"].T


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, largest first; ties go to the lower index."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def sparse_moe(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str,
               cfg: MixtralConfig) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MixtralSparseMoeBlock: x (N, H) normalised tokens -> (output (N, H), router logits (N, E),
    selected experts (N, k))."""
    N, H = x.shape
    router_logits = x @ params[prefix + "gate.weight"].T       # (N, E)
    routing = softmax(router_logits, axis=-1)                  # over all experts
    selected = top_k(routing, cfg.num_experts_per_tok)         # (N, k)
    weights = np.take_along_axis(routing, selected, axis=-1)   # (N, k)
    weights = weights / weights.sum(axis=-1, keepdims=True)    # renormalise the k to sum 1
    out = np.zeros((N, H), dtype=x.dtype)
    for e in range(cfg.num_local_experts):
        tokens, slot = np.nonzero(selected == e)
        if tokens.size == 0:
            continue
        w1 = params[f"{prefix}experts.{e}.w1.weight"]  # (I, H)
        w2 = params[f"{prefix}experts.{e}.w2.weight"]  # (H, I)
        w3 = params[f"{prefix}experts.{e}.w3.weight"]  # (I, H)
        xe = x[tokens]
        ye = (silu(xe @ w1.T) * (xe @ w3.T)) @ w2.T
        out[tokens] += ye * weights[tokens, slot][:, None]  # index_add_ of the weighted outputs
    return out, router_logits, selected


@dataclass
class ForwardResult:
    logits: np.ndarray                 # (B, T, V)
    router_logits: List[np.ndarray]    # per layer, (B*T, E)
    selected_experts: List[np.ndarray]  # per layer, (B*T, k)


def forward(params: Dict[str, np.ndarray], cfg: MixtralConfig, input_ids: np.ndarray) -> ForwardResult:
    """MixtralForCausalLM forward without a cache: (B, T) token ids -> logits (B, T, V)."""
    input_ids = np.asarray(input_ids, dtype=np.int64)
    B, T = input_ids.shape
    h = params["model.embed_tokens.weight"][input_ids]  # (B, T, H)
    cos, sin = rope_cos_sin(T, cfg.head_dim, cfg.rope_theta)
    router_logits, selected = [], []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rms_norm(h, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + attention(a, params, p + "self_attn.", cfg, cos, sin)
        m = rms_norm(h, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        moe_out, logits_i, selected_i = sparse_moe(m.reshape(B * T, -1), params, p + "block_sparse_moe.", cfg)
        h = h + moe_out.reshape(B, T, -1)
        router_logits.append(logits_i)
        selected.append(selected_i)
    h = rms_norm(h, params["model.norm.weight"], cfg.rms_norm_eps)
    lm_head = params.get("lm_head.weight")
    if lm_head is None and cfg.tie_word_embeddings:
        lm_head = params["model.embed_tokens.weight"]
    logits = h @ lm_head.T
    return ForwardResult(logits, router_logits, selected)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy over positions whose label is not -100 (labels NOT shifted here)."""
    flat = logits.reshape(-1, logits.shape[-1])
    lab = np.asarray(labels, dtype=np.int64).reshape(-1)
    keep = lab != IGNORE_INDEX
    if not np.any(keep):
        raise ValueError("no labelled positions")
    z = flat[keep]
    zmax = z.max(axis=-1, keepdims=True)
    logsumexp = zmax[:, 0] + np.log(np.exp(z - zmax).sum(axis=-1))
    picked = z[np.arange(z.shape[0]), lab[keep]]
    return float(np.mean(logsumexp - picked))


def load_balancing_loss(router_logits: List[np.ndarray], num_experts: int, top_k_: int) -> float:
    """transformers' load_balancing_loss_func without an attention mask (Switch Transformer aux
    loss): E * sum_e mean_tokens(one_hot(top-k))[k, e] * mean_tokens(softmax)[e], over all layers'
    tokens concatenated. The aux_loss case of run_reference_check.sh holds moepeak to it."""
    logits = np.concatenate(router_logits, axis=0)      # (L*N, E)
    routing = softmax(logits, axis=-1)
    selected = top_k(routing, top_k_)                   # (L*N, k)
    expert_mask = np.eye(num_experts)[selected]         # (L*N, k, E)
    tokens_per_expert = expert_mask.mean(axis=0)        # (k, E)
    router_prob_per_expert = routing.mean(axis=0)       # (E,)
    return float(np.sum(tokens_per_expert * router_prob_per_expert[None, :]) * num_experts)


def loss(params: Dict[str, np.ndarray], cfg: MixtralConfig, input_ids: np.ndarray,
         labels: np.ndarray, return_forward: bool = False):
    """MixtralForCausalLM's training loss: mean CE over labelled positions, plus
    router_aux_loss_coef * load-balancing loss when output_router_logits is set (as transformers).
    With return_forward=True returns (loss, ForwardResult)."""
    result = forward(params, cfg, input_ids)
    value = cross_entropy(result.logits, labels)
    if cfg.output_router_logits and cfg.router_aux_loss_coef != 0.0:
        value += cfg.router_aux_loss_coef * load_balancing_loss(
            result.router_logits, cfg.num_local_experts, cfg.num_experts_per_tok)
    return (value, result) if return_forward else value
