"""An independent float64 numpy reference of Hugging Face transformers' MoE causal LMs: forward and
training loss of MixtralForCausalLM (model_type "mixtral"), Qwen3MoeForCausalLM ("qwen3_moe"),
GptOssForCausalLM ("gpt_oss") and DeepseekV3ForCausalLM ("deepseek_v3", and Kimi-K2's "kimi_k2").

Written from transformers' modeling_mixtral.py, modular/modeling/configuration_qwen3_moe.py,
modeling/configuration_gpt_oss.py, modeling/configuration_deepseek_v3.py, masking_utils.py and
modeling_rope_utils.py (read at transformers 5.25.0; mixtral and qwen3_moe compared with 4.51.0,
4.57.6 and 5.0 to 5.10), sharing no code with moepeak, so that tests/reference/check_step_dump.py
and hf_roundtrip.py can hold moepeak's loss and gradients to it:

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

deepseek_v3 (and kimi_k2), 12 float64 models (7 written by hand, 5 by hf_roundtrip.py make, 8 of
them in the release's config form and one with --mtp 1): q_lora_rank 16 and null, rope_interleave
true and false, yarn with mscale = mscale_all_dim = 1 (DeepSeek's), with mscale 0.707 /
mscale_all_dim 0.5, with mscale_all_dim alone, and default RoPE; norm_topk_prob on and off; groups
4 keep 2, 4 keep 1 and 1 keep 1; top-2 and top-3 of 8; first_k_dense_replace 0, 1 and 2; 1 and 2
shared experts; attention biases once, a tied head once, kimi_k2 twice (loaded into transformers as
deepseek_v3); correction biases of std 0.2 to 0.5 that change 40% to 96% of the tokens' choices;
weights of std 0.2 to 0.3; no missing or unexpected keys (--mtp: only the MTP layer's), and
save_pretrained writes the same names and values back (its config.json gives the same loss here):
logits within 1.1e-6 relative, router logits 5.1e-7, losses 2.6e-8, gradients within 2.0e-6 of
their norm (every tensor, along a random direction and the gradient; the correction bias's finite
differences are 0, as transformers' buffer has no gradient), softmax and cos/sin scales exactly;
with the float32 steps (RMSNorm, RoPE angles, the router, the attention softmax) patched to
float64: logits 5.0e-15, router logits 2.5e-15, losses 6.0e-16, gradients 1.4e-8 (the finite
differences' own error). Each misreading tried moves logits by 0.1 or more (interleaving ignored
0.5 to 1.8, the mscale^2 of the softmax scale 0.13 to 1.1, routing weights from the biased scores
0.18 to 0.79, no group limit 0.5 to 1.0, a group's max for its top-2 sum 0.5 to 1.1, no
routed_scaling_factor 0.4 to 0.8, the correction bias ignored 0.6 to 1.5, YaRN's cos/sin factor
dropped where mscale != mscale_all_dim 0.1 to 0.3), except the latent norms' eps: rms_norm_eps 1e-5
for their 1e-6 moves logits 1.2e-5 to 2.5e-5 (still 1e9 times the patched agreement;
hf_roundtrip.py's model uses rms_norm_eps 0.01, where the same misreading moves the loss by
4.5e-4). A step dump made by the patched transformers (float32 weights and gradients) passes
check_step_dump.py (451 checks), and one with that misreading fails it (loss 9.7e-4, 388 checks).
sequence_balance_loss equals a torch computation from transformers' own router logits and choices
(within 1.4e-16), and its finite differences the autograd gradient (1.6e-9 of its norm). FP8: the
dequantised weights equal, bit for bit, torch's float8_e4m3fn decoding times the block scale and
transformers' _dequantize_fp8_weight (blocks 4, 9 with partial edges, and 128), and the encoder
equals torch's rounding to float8_e4m3fn; transformers' load-time Fp8Dequantize (dequantize=True)
agrees for whole blocks (logits 8.8e-7) but infers the block from the scale grid, so partial edge
blocks are misread (block 9 on these shapes: every weight wrong, logits 0.9 off) or refused.

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
biased router with a softmax over the top-k logits, fused clamped-SwiGLU experts with biases),
hf_reference_deepseek_v3.py (its own attention, MLA: low-rank q and kv with a rotary key shared
by the heads, interleaved RoPE, a YaRN-scaled softmax; dense first layers; sigmoid routing with
a correction bias and group limits, scaled weights, shared experts; MTP modules ignored).
Shared layers and the resolved config: hf_reference_common.py. A family module provides
MODEL_TYPE, config_from_dict(j, where), mlp_shapes(cfg, i) and mlp(x, params, i, cfg) ->
(output, router logits or None, selected experts or None, clamped activations or None); and
optionally MODEL_TYPES (every model_type it reads), attention_shapes(cfg, i) and attention(x,
params, i, cfg, cos, sin) in place of the shared GQA attention (hf_reference_common.attention),
mtp_shapes(cfg) (tensors a checkpoint may hold that the forward ignores) and describe(cfg).

FP8 checkpoints (DeepSeek-V3's and Kimi-K2's release: F8_E4M3 weights with F32 <name>_scale_inv
block scales, config.json's quantization_config {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [128, 128], ...}): load_params dequantises them to the fp32 products
(hf_reference_fp8.py), so the model is the dequantised one, as transformers' dequantize=True and
moepeak's core/checkpoint/fp8.h have it; the rest of the reference never sees FP8.

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

deepseek_v3 has no aux loss in transformers (loss is the CE alone); its sequence-wise balance loss
(DeepSeek-V3's paper) is sequence_balance_loss (hf_reference_deepseek_v3.py), added by loss() only
when given its alpha (check_step_dump.py does, from a moepeak dump's "seq_aux" / "aux_loss_alpha").

Tied embeddings (any family): with tie_word_embeddings the head is model.embed_tokens.weight and
the checkpoint (and a moepeak dump) has no lm_head.weight; one holding lm_head.weight anyway is
refused here as ambiguous.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import hf_reference_deepseek_v3
import hf_reference_fp8
import hf_reference_gpt_oss
import hf_reference_mixtral
import hf_reference_qwen3_moe
# The shared names, re-exported: check_step_dump.py, hf_roundtrip.py and hand-held harnesses use
# them as hf_reference.<name>.
from hf_reference_common import (IGNORE_INDEX, ForwardResult, ModelConfig, attention,  # noqa: F401
                                 linear, rms_norm, silu, softmax, top_k)
from hf_reference_deepseek_v3 import sequence_balance_loss  # noqa: F401
from hf_reference_rope import (ROPE_TYPES, RopeParameters, apply_rope, rope_cos_sin,  # noqa: F401
                               rope_inv_freq, rotate_half)

# config.json's model_type -> the family's module (a module may serve several model types).
FAMILIES = {t: m for m in (hf_reference_mixtral, hf_reference_qwen3_moe, hf_reference_gpt_oss,
                           hf_reference_deepseek_v3)
            for t in getattr(m, "MODEL_TYPES", (m.MODEL_TYPE,))}

# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "F16": "<f2",
                       "BF16": "<u2"}


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they are (the top half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors_raw(path: str) -> Dict[str, Tuple[str, Tuple[int, ...], bytes]]:
    """Reads a .safetensors file: u64 little-endian header length, JSON header, raw data.

    Each header entry is {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative
    to the first byte after the header. "__metadata__" is skipped. Returns name -> (safetensors
    dtype, shape, the tensor's bytes), any dtype.
    """
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    tensors: Dict[str, Tuple[str, Tuple[int, ...], bytes]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        tensors[name] = (entry["dtype"], tuple(int(s) for s in entry["shape"]), bytes(data[begin:end]))
    return tensors


def read_safetensors(path: str, fp8_codes: bool = False) -> Dict[str, np.ndarray]:
    """Reads a .safetensors file (read_safetensors_raw) into read-only arrays; BF16 tensors come
    back as the float32 values they hold. F8_E4M3 tensors (float8_e4m3fn) come back as their uint8
    codes when fp8_codes, and are refused otherwise: their values need their <name>_scale_inv
    (load_params pairs them)."""
    tensors: Dict[str, np.ndarray] = {}
    for name, (dtype_name, shape, raw) in read_safetensors_raw(path).items():
        dtype = "u1" if dtype_name == "F8_E4M3" and fp8_codes else _SAFETENSORS_DTYPES.get(dtype_name)
        if dtype is None:
            why = " (FP8 weights: read them with load_params)" if dtype_name == "F8_E4M3" else ""
            raise ValueError(f"{path}: tensor {name}: dtype {dtype_name} is not supported here{why}")
        array = np.frombuffer(raw, dtype=dtype)
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {array.size} elements for shape {shape}")
        if dtype_name == "BF16":
            array = bf16_bits_to_float32(array)
        tensors[name] = array.reshape(shape)
    return tensors


def checkpoint_files(path: str) -> Dict[str, Dict[str, str]]:
    """The safetensors files of a Hugging Face model directory -> the tensor names each must hold
    (model.safetensors.index.json's weight_map; {} for a lone model.safetensors, whose names are
    not checked)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return {os.path.join(path, "model.safetensors"): {}}
    with open(index, "r", encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    files: Dict[str, Dict[str, str]] = {}
    for name, file in weight_map.items():
        files.setdefault(os.path.join(path, file), {})[name] = file
    return files


def fp8_block_of(path: str) -> Optional[Tuple[int, int]]:
    """quantization_config.weight_block_size of the model directory's config.json when its
    quant_method is "fp8" (DeepSeek-V3's and Kimi-K2's FP8 release), else None."""
    config = os.path.join(path, "config.json")
    if not os.path.isdir(path) or not os.path.exists(config):
        return None
    with open(config, "r", encoding="utf-8") as f:
        q = json.load(f).get("quantization_config") or {}
    if q.get("quant_method") != "fp8":
        return None
    if q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{config}: quantization_config.fmt {q['fmt']!r}: only e4m3 is decoded here")
    block = q.get("weight_block_size")
    if not isinstance(block, list) or len(block) != 2:
        raise ValueError(f"{config}: quantization_config.weight_block_size {block!r}: expected [rows, cols]")
    return int(block[0]), int(block[1])


def load_params(path: str, fp8_block: Optional[Tuple[int, int]] = None) -> Dict[str, np.ndarray]:
    """The weights of a safetensors file, or of a Hugging Face model directory (model.safetensors,
    or the files model.safetensors.index.json maps), as writable float64 arrays keyed by HF
    tensor name.

    FP8 weights (F8_E4M3 <name> with F32 <name>_scale_inv, hf_reference_fp8.py) come back
    dequantised: the fp32 products code value * block scale, then widened to float64 exactly;
    <name>_scale_inv is consumed. The block is fp8_block, else (a directory) its config.json's
    quantization_config.weight_block_size. An F8_E4M3 tensor without its scale, a scale without
    its F8_E4M3 tensor, or FP8 without a block, is a ValueError.
    """
    files = checkpoint_files(path) if os.path.isdir(path) else {path: {}}
    if fp8_block is None:
        fp8_block = fp8_block_of(path)
    raw: Dict[str, np.ndarray] = {}
    for file in sorted(files):
        for name, t in read_safetensors(file, fp8_codes=True).items():
            if files[file] and name not in files[file]:
                raise ValueError(f"{path}: {os.path.basename(file)} holds {name}, which the index does "
                                 f"not put there")
            raw[name] = t
    missing = {n for names in files.values() for n in names} - set(raw)
    if missing:
        raise ValueError(f"{path}: the index names tensors no file holds: {sorted(missing)[:3]}")
    params: Dict[str, np.ndarray] = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            if name[:-len("_scale_inv")] not in raw or raw[name[:-len("_scale_inv")]].dtype != np.uint8:
                raise ValueError(f"{path}: {name} scales no F8_E4M3 tensor {name[:-len('_scale_inv')]}")
            continue
        if t.dtype == np.uint8:  # F8_E4M3 codes
            if name + "_scale_inv" not in raw:
                raise ValueError(f"{path}: F8_E4M3 tensor {name} has no {name}_scale_inv")
            if fp8_block is None:
                raise ValueError(f"{path}: F8_E4M3 tensor {name}: no weight_block_size (config.json's "
                                 f"quantization_config, or fp8_block)")
            t = hf_reference_fp8.block_dequantize(t, raw[name + "_scale_inv"], fp8_block, name)
        params[name] = np.array(t, dtype=np.float64)
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
    """Every Hub tensor name the model's forward reads and its shape, in a fixed order (the
    order hf_roundtrip.py draws random weights in). Not deepseek_v3's MTP modules (mtp_shapes)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    family = FAMILIES[cfg.model_type]
    shapes: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if hasattr(family, "attention_shapes"):  # the family's own attention (deepseek_v3: MLA)
            shapes.update(family.attention_shapes(cfg, i))
        else:
            shapes.update(gqa_attention_shapes(cfg, i))
        shapes.update(family.mlp_shapes(cfg, i))
    return shapes


def gqa_attention_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's tensors of the shared GQA attention (hf_reference_common.attention)."""
    h, d = cfg.hidden_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes: Dict[str, Tuple[int, ...]] = {}
    a = f"model.layers.{i}.self_attn."
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
    return shapes


def mtp_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """The multi-token-prediction tensors a checkpoint of the family may hold besides
    param_shapes' (deepseek_v3: model.layers.{num_hidden_layers + j}.*), which the forward
    ignores; {} for the other families."""
    family = FAMILIES[cfg.model_type]
    return family.mtp_shapes(cfg) if hasattr(family, "mtp_shapes") else {}


def check_params(params: Dict[str, np.ndarray], cfg: ModelConfig) -> None:
    """Raises ValueError unless params holds exactly param_shapes(cfg)'s names and shapes, plus
    either all of mtp_shapes(cfg)'s or none."""
    expect = param_shapes(cfg)
    mtp = mtp_shapes(cfg)
    if any(n in params for n in mtp):
        expect.update(mtp)
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


def forward(params: Dict[str, np.ndarray], cfg: ModelConfig, input_ids: np.ndarray,
            position_ids: Optional[np.ndarray] = None,
            document_starts: Optional[np.ndarray] = None) -> ForwardResult:
    """The CausalLM forward without a cache: (B, T) token ids -> logits (B, T, V). Packed
    documents: position_ids (B, T) the positions RoPE takes (default 0..T-1 in each row) and
    document_starts (B, T) the first position of each position's document, whose keys alone a
    query sees (default: the whole row)."""
    check_params(params, cfg)
    family = FAMILIES[cfg.model_type]
    attend = getattr(family, "attention", attention)  # the family's own, else the shared GQA
    input_ids = np.asarray(input_ids, dtype=np.int64)
    B, T = input_ids.shape
    h = params["model.embed_tokens.weight"][input_ids]  # (B, T, H)
    cos, sin = rope_cos_sin(cfg, T, position_ids)
    router_logits: List[np.ndarray] = []
    selected: List[np.ndarray] = []
    clamped: List[np.ndarray] = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rms_norm(h, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + attend(a, params, i, cfg, cos, sin, document_starts)
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
         labels: np.ndarray, return_forward: bool = False, sequence_aux_alpha: float = 0.0,
         position_ids: Optional[np.ndarray] = None, document_starts: Optional[np.ndarray] = None):
    """The CausalLM's training loss: mean CE over labelled positions, plus
    router_aux_loss_coef * load-balancing loss when output_router_logits is set (as transformers);
    plus, when sequence_aux_alpha > 0 (deepseek_v3 only; not transformers'), DeepSeek-V3's
    sequence-wise balance loss of that alpha. With return_forward=True returns
    (loss, ForwardResult). position_ids, document_starts: packed documents (forward)."""
    result = forward(params, cfg, input_ids, position_ids, document_starts)
    value = cross_entropy(result.logits, labels)
    if cfg.output_router_logits and not result.router_logits:
        raise ValueError("output_router_logits with no MoE layer: transformers fails on the empty "
                         "router_logits tuple")
    if cfg.output_router_logits and cfg.router_aux_loss_coef != 0.0:
        value += cfg.router_aux_loss_coef * load_balancing_loss(
            result.router_logits, cfg.num_experts, cfg.num_experts_per_tok)
    if sequence_aux_alpha:
        if cfg.model_type not in ("deepseek_v3", "kimi_k2"):
            raise ValueError(f"the sequence-wise balance loss is deepseek_v3's, not {cfg.model_type}'s")
        value += sequence_balance_loss(result, input_ids.shape[0], cfg.num_experts,
                                       cfg.num_experts_per_tok, sequence_aux_alpha)
    return (value, result) if return_forward else value
