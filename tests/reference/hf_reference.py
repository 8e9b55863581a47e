"""An independent float64 numpy reference of Hugging Face transformers' MoE causal LMs: forward and
training loss of MixtralForCausalLM (model_type "mixtral"), Qwen3MoeForCausalLM ("qwen3_moe") and
GptOssForCausalLM ("gpt_oss").

Written from transformers' modeling_mixtral.py, modular/modeling/configuration_qwen3_moe.py,
modeling/configuration_gpt_oss.py, masking_utils.py and modeling_rope_utils.py (read at
transformers 5.25.0; mixtral and qwen3_moe compared with 4.51.0, 4.57.6 and 5.0 to 5.10), sharing
no code with moepeak, so that tests/reference/check_step_dump.py and hf_roundtrip.py can hold
moepeak's loss and gradients to it:

    params = load_params("dump/model.safetensors")      # name -> float64 array, HF tensor names
    cfg = read_config("dump/config.json")               # family from config.json's model_type
    batch = read_safetensors("dump/batch.safetensors")  # input_ids, labels: int64 (B, T)
    value = loss(params, cfg, batch["input_ids"], batch["labels"])

Everything is computed in float64 (moepeak computes in float32; transformers computes RoPE angles,
RMSNorm and its losses in float32 even for a float64 model), so the reference is the more exact
one. Held by hand against transformers 5.25.0 / torch 2.15.0 running float64 models of every
family and every RoPE type (hf_reference_rope.py) in both config forms: mixtral and qwen3_moe
logits agree within 3.2e-7 relative, float64 losses within 1.6e-8, gradients (autograd vs finite
differences here) within 3e-7 of their norm; the residue is transformers' float32 RoPE angles and
norms, while a wrong formula moves logits by 1e-2 or more. gpt_oss, 9 float64 models (both config
forms and none: GptOssConfig's own yarn, layer_types and head_dim 64; yarn with truncate false and
true, llama3, default; 2 to 4 layers mixing sliding (windows 2 to 5 < T = 16) and full; biases on
and off, a tied head, top-2 of 4 and top-3 of 5, swiglu_limit 0.5 to 7 with up to 39% of gates and
78% of ups clamped, alpha 1.3 and 1.702, the aux loss; 3 of them hf_roundtrip.py's), weights of
std 0.2 to 0.3: logits within 1.3e-6 relative, router logits 1.3e-6, losses 4.3e-8, aux losses
8e-8, gradients within 3.5e-6 of their norm (std 0.6 weights: 7.5e-6, 1.4e-7, 1.5e-5); with
transformers' float32 steps (RMSNorm, RoPE angles, aux sums) patched to float64 the logits agree
within 9.4e-14, losses 1.2e-15 and gradients 3.3e-7 (the finite differences' own error), while
each misreading tried (sinks, window +-1, clamp, alpha, gate/up interleaving, the up + 1, any
bias, a softmax over all experts, yarn's truncate) moves logits by 0.1 or more.
Only numpy and the standard library are used (CI: Debian 12's python3 with numpy 1.24).

Labels follow moepeak's step dump: labels[b, t] is already the target of position t (the next
token), and -100 marks an ignored position. transformers' ForCausalLMLoss would shift labels by
one itself; here they are NOT shifted again.

The families (config.json's model_type; a missing model_type means mixtral, any other is an error)
-------------------------------------------------------------------------------------------------
All: embed -> L x [x += attn(rms_norm(x)); x += mlp(rms_norm(x))] -> rms_norm -> lm_head, RMSNorm
y = w * x / sqrt(mean(x^2) + eps), GQA (query head h reads kv head h // (heads / kv_heads)),
causal softmax attention scaled by head_dim^-0.5, RoPE (hf_reference_rope.py), top-k routing with
ties to the lower index, expert outputs summed with their routing weights. What each family adds,
its config defaults and its Hub tensor names: hf_reference_mixtral.py (softmax over all experts,
then top-k, silu-gated experts), hf_reference_qwen3_moe.py (q/k norms, dense layers, optional
renormalisation), hf_reference_gpt_oss.py (attention biases and sinks, sliding and full layers,
biased router with a softmax over the top-k logits, fused clamped-SwiGLU experts with biases).
Shared layers and the resolved config: hf_reference_common.py. A family module provides
MODEL_TYPE, config_from_dict(j, where), mlp_shapes(cfg, i) and mlp(x, params, i, cfg) ->
(output, router logits or None, selected experts or None, clamped activations or None).

Load-balancing (aux) loss. Added as router_aux_loss_coef * aux when output_router_logits, as in
load_balancing_loss_func: E * sum_e f_e * P_e over all MoE layers' tokens, f_e the fraction of
top-k slots choosing e, P_e the mean router probability, probabilities = softmax(router logits).
Which tensor the function receives: the raw router logits (it applies the softmax itself) in
transformers 4.x (the MoE block's returned router_logits; 4.51 and 4.57 checked) and again from
5.6.0 on (Qwen3MoeTopKRouter/MixtralTopKRouter return (router_logits, scores, indices), recorded at
index 0; 5.6.0, 5.7.0, 5.8.0, 5.10.4 and 5.25.0 checked). In 5.0.0 to 5.5.4 (5.0.0, 5.5.0 and 5.5.4
checked) the routers overwrote router_logits with the softmax before returning it, so those
releases applied the softmax twice inside the aux loss (the routing itself was unaffected). This
reference implements the current one (a single softmax of the logits). gpt_oss's router logits
are the biased x W^T + b (GptOssTopKRouter, recorded at index 0 as well; 5.25.0 read), softmaxed
over all E experts by the function although the routing itself softmaxes only the k chosen.
transformers 5.25 sums the function's counts and probabilities in float32, here float64. Only MoE
layers have a router, so qwen3_moe's dense layers contribute nothing; with output_router_logits
and no MoE layer at all transformers 5.25 fails (IndexError on the empty tuple) and so does this
reference (ValueError). (4.51 fails whenever output_router_logits meets a dense layer: it collects
None for it.)

Tied embeddings (any family): with tie_word_embeddings the head is model.embed_tokens.weight and
the checkpoint (and a moepeak dump) has no lm_head.weight; one holding lm_head.weight anyway is
refused here as ambiguous.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, List, Tuple

import numpy as np

import hf_reference_gpt_oss
import hf_reference_mixtral
import hf_reference_qwen3_moe
# The shared names, re-exported: check_step_dump.py, hf_roundtrip.py and hand-held harnesses use
# them as hf_reference.<name>.
from hf_reference_common import (IGNORE_INDEX, ForwardResult, ModelConfig, attention,  # noqa: F401
                                 linear, rms_norm, silu, softmax, top_k)
from hf_reference_rope import (ROPE_TYPES, RopeParameters, apply_rope, rope_cos_sin,  # noqa: F401
                               rope_inv_freq, rotate_half)

# config.json's model_type -> the family's module.
FAMILIES = {m.MODEL_TYPE: m for m in (hf_reference_mixtral, hf_reference_qwen3_moe, hf_reference_gpt_oss)}

# ---------------------------------------------------------------------------------------------
# safetensors
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
# config.json
# ---------------------------------------------------------------------------------------------


def config_from_dict(j: Dict[str, Any], where: str = "config.json") -> ModelConfig:
    """A ModelConfig from a parsed config.json, with transformers 5.25's defaults of its family
    for missing fields. Raises ValueError naming the field for what this reference does not
    implement."""
    model_type = j.get("model_type", "mixtral")
    if model_type not in FAMILIES:
        raise ValueError(f"{where}: model_type {model_type!r} is not implemented by this reference "
                         f"(implemented: {', '.join(FAMILIES)})")
    return FAMILIES[model_type].config_from_dict(j, where)


def read_config(path: str) -> ModelConfig:
    """Reads a Hugging Face config.json (any family above, transformers 4 or 5 form)."""
    with open(path, "r", encoding="utf-8") as f:
        return config_from_dict(json.load(f), where=path)


# ---------------------------------------------------------------------------------------------
# Tensor names
# ---------------------------------------------------------------------------------------------


def param_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Every Hub tensor name of the model and its shape, in a fixed order (the order
    hf_roundtrip.py draws random weights in)."""
    h, v, d = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        shapes[a + "q_proj.weight"] = (nq, h)
        shapes[a + "k_proj.weight"] = (nkv, h)
        shapes[a + "v_proj.weight"] = (nkv, h)
        shapes[a + "o_proj.weight"] = (h, nq)
        if cfg.attention_bias:
            shapes[a + "q_proj.bias"] = (nq,)
            shapes[a + "k_proj.bias"] = (nkv,)
            shapes[a + "v_proj.bias"] = (nkv,)
            shapes[a + "o_proj.bias"] = (h,)
        if cfg.qk_norm:
            shapes[a + "q_norm.weight"] = (d,)
            shapes[a + "k_norm.weight"] = (d,)
        if cfg.attention_sinks:
            shapes[a + "sinks"] = (cfg.num_attention_heads,)
        shapes.update(FAMILIES[cfg.model_type].mlp_shapes(cfg, i))
    return shapes


def check_params(params: Dict[str, np.ndarray], cfg: ModelConfig) -> None:
    """Raises ValueError unless params holds exactly param_shapes(cfg)'s names and shapes."""
    expect = param_shapes(cfg)
    problems = []
    missing = [n for n in expect if n not in params]
    extra = sorted(n for n in params if n not in expect)
    if missing:
        problems.append(f"missing {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    if extra:
        why = (" (tie_word_embeddings is true: the head is model.embed_tokens.weight)"
               if "lm_head.weight" in extra and cfg.tie_word_embeddings else "")
        problems.append(f"unexpected {extra[:4]}{' ...' if len(extra) > 4 else ''}{why}")
    for n, shape in expect.items():
        if n in params and tuple(params[n].shape) != shape:
            problems.append(f"{n}: shape {tuple(params[n].shape)}, config says {shape}")
    if problems:
        raise ValueError(f"weights do not match the {cfg.model_type} config: " + "; ".join(problems[:6]))


# ---------------------------------------------------------------------------------------------
# The model and its loss
# ---------------------------------------------------------------------------------------------


def forward(params: Dict[str, np.ndarray], cfg: ModelConfig, input_ids: np.ndarray) -> ForwardResult:
    """The CausalLM forward without a cache: (B, T) token ids -> logits (B, T, V)."""
    check_params(params, cfg)
    family = FAMILIES[cfg.model_type]
    input_ids = np.asarray(input_ids, dtype=np.int64)
    B, T = input_ids.shape
    h = params["model.embed_tokens.weight"][input_ids]  # (B, T, H)
    cos, sin = rope_cos_sin(cfg, T)
    router_logits: List[np.ndarray] = []
    selected: List[np.ndarray] = []
    clamped: List[np.ndarray] = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rms_norm(h, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + attention(a, params, i, cfg, cos, sin)
        m = rms_norm(h, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        mlp_out, logits_i, selected_i, clamped_i = family.mlp(m, params, i, cfg)
        h = h + mlp_out
        if logits_i is not None:  # a MoE layer
            router_logits.append(logits_i)
            selected.append(selected_i)
        if clamped_i is not None:
            clamped.append(clamped_i)
    h = rms_norm(h, params["model.norm.weight"], cfg.rms_norm_eps)
    lm_head = params["model.embed_tokens.weight"] if cfg.tie_word_embeddings else params["lm_head.weight"]
    logits = h @ lm_head.T
    return ForwardResult(logits, router_logits, selected, clamped)


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
    loss) of the raw router logits: E * sum_e mean_tokens(one_hot(top-k))[k, e] *
    mean_tokens(softmax)[e], over all MoE layers' tokens concatenated. The aux_loss case of
    run_reference_check.sh holds moepeak to it."""
    logits = np.concatenate(router_logits, axis=0)      # (L*N, E)
    routing = softmax(logits, axis=-1)
    selected = top_k(routing, top_k_)                   # (L*N, k)
    expert_mask = np.eye(num_experts)[selected]         # (L*N, k, E)
    tokens_per_expert = expert_mask.mean(axis=0)        # (k, E)
    router_prob_per_expert = routing.mean(axis=0)       # (E,)
    return float(np.sum(tokens_per_expert * router_prob_per_expert[None, :]) * num_experts)


def loss(params: Dict[str, np.ndarray], cfg: ModelConfig, input_ids: np.ndarray,
         labels: np.ndarray, return_forward: bool = False):
    """The CausalLM's training loss: mean CE over labelled positions, plus
    router_aux_loss_coef * load-balancing loss when output_router_logits is set (as transformers).
    With return_forward=True returns (loss, ForwardResult)."""
    result = forward(params, cfg, input_ids)
    value = cross_entropy(result.logits, labels)
    if cfg.output_router_logits and not result.router_logits:
        raise ValueError("output_router_logits with no MoE layer: transformers fails on the empty "
                         "router_logits tuple")
    if cfg.output_router_logits and cfg.router_aux_loss_coef != 0.0:
        value += cfg.router_aux_loss_coef * load_balancing_loss(
            result.router_logits, cfg.num_experts, cfg.num_experts_per_tok)
    return (value, result) if return_forward else value
