"""An independent float64 numpy reference of Hugging Face transformers' MoE causal LMs: forward and
training loss of MixtralForCausalLM (model_type "mixtral") and Qwen3MoeForCausalLM ("qwen3_moe").

Written from transformers' modeling_mixtral.py, modular/modeling/configuration_qwen3_moe.py and
modeling_rope_utils.py (read at transformers 5.25.0, compared with 4.51.0, 4.57.6 and 5.0 to 5.10),
sharing no code with moepeak, so that tests/reference/check_step_dump.py and hf_roundtrip.py can hold
moepeak's loss and gradients to it:

    params = load_params("dump/model.safetensors")      # name -> float64 array, HF tensor names
    cfg = read_config("dump/config.json")               # family from config.json's model_type
    batch = read_safetensors("dump/batch.safetensors")  # input_ids, labels: int64 (B, T)
    value = loss(params, cfg, batch["input_ids"], batch["labels"])

Everything is computed in float64 (moepeak computes in float32; transformers computes RoPE angles
and its loss in float32 even for a float64 model), so the reference is the more exact one. Held
by hand against transformers 5.25.0 / torch 2.15.0 running float64 models of both families and
every RoPE type below in both config forms: logits agree within 3.2e-7 relative, float64 losses
within 1.6e-8, gradients (autograd vs finite differences here) within 3e-7 of their norm; the
residue is transformers' float32 RoPE angles, while a wrong formula moves logits by 1e-2 or more.
Only numpy and the standard library are used (CI: Debian 12's python3 with numpy 1.24).

Labels follow moepeak's step dump: labels[b, t] is already the target of position t (the next
token), and -100 marks an ignored position. transformers' ForCausalLMLoss would shift labels by
one itself; here they are NOT shifted again.

The families (config.json's model_type; a missing model_type means mixtral, any other is an error)
-------------------------------------------------------------------------------------------------
Both: embed -> L x [x += attn(rms_norm(x)); x += mlp(rms_norm(x))] -> rms_norm -> lm_head, silu
gated MLPs, RMSNorm y = w * x / sqrt(mean(x^2) + eps), GQA (query head h reads kv head
h // (heads / kv_heads)), causal softmax attention scaled by head_dim^-0.5, router softmax over
all experts in fp32 (here fp64), top-k with ties to the lower index, expert outputs summed with
their routing weights.

mixtral: every layer is MoE; the k weights are always renormalised to sum 1; no attention biases,
no q/k norms. Hub tensor names: model.layers.{i}.block_sparse_moe.gate.weight (E, H) and
...block_sparse_moe.experts.{e}.w1/w3/w2.weight (gate (I, H), up (I, H), down (H, I)).

qwen3_moe: q and k get a per-head RMSNorm over head_dim (self_attn.q_norm.weight,
self_attn.k_norm.weight: (head_dim,), eps rms_norm_eps) after the projection and before RoPE;
head_dim is its own field; q/k/v/o_proj carry biases (.bias) when attention_bias is true. Layer i
is MoE when `i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0`
(Qwen3MoeDecoderLayer), otherwise a dense MLP mlp.{gate,up,down}_proj.weight of width
intermediate_size. MoE layers: router mlp.gate.weight (E, H), experts
mlp.experts.{e}.{gate,up,down}_proj.weight of width moe_intermediate_size; the top-k weights are
renormalised only when norm_topk_prob. The sliding window applies only when use_sliding_window.

Expert tensor names. transformers 5 keeps each layer's experts fused in the module
(mlp.experts.gate_up_proj (E, 2*I, H) = per expert cat([gate_proj, up_proj], dim 0), and
mlp.experts.down_proj (E, H, I); Mixtral's block_sparse_moe is renamed mlp), but
conversion_mapping.py converts on load from the per-expert Hub names above (qwen3_moe uses the
"qwen2_moe" mapping: mlp.experts.*.gate_proj/up_proj.weight -> MergeModulelist(dim=0) +
Concatenate(dim=1) -> gate_up_proj; mlp.experts.*.down_proj.weight -> down_proj; mixtral:
block_sparse_moe -> mlp, experts.*.w1/w3 -> gate_up_proj, experts.*.w2 -> down_proj), and
save_pretrained reverts it: checkpoints saved by transformers 5.25 carry the per-expert Hub names
(checked). This reference takes the per-expert Hub names only.

Load-balancing (aux) loss. Added as router_aux_loss_coef * aux when output_router_logits, as in
load_balancing_loss_func: E * sum_e f_e * P_e over all MoE layers' tokens, f_e the fraction of
top-k slots choosing e, P_e the mean router probability, probabilities = softmax(router logits).
Which tensor the function receives: the raw router logits (it applies the softmax itself) in
transformers 4.x (the MoE block's returned router_logits; 4.51 and 4.57 checked) and again from
5.6.0 on (Qwen3MoeTopKRouter/MixtralTopKRouter return (router_logits, scores, indices), recorded at
index 0; 5.6.0, 5.7.0, 5.8.0, 5.10.4 and 5.25.0 checked). In 5.0.0 to 5.5.4 (5.0.0, 5.5.0 and 5.5.4
checked) the routers overwrote router_logits with the softmax before returning it, so those
releases applied the softmax twice inside the aux loss (the routing itself was unaffected). This
reference implements the current one (a single softmax of the logits). Only MoE layers have a
router, so qwen3_moe's dense layers contribute nothing; with output_router_logits and no MoE layer
at all transformers 5.25 fails (IndexError on the empty tuple) and so does this reference
(ValueError). (4.51 fails whenever output_router_logits meets a dense layer: it collects None
for it.)

Tied embeddings (any family): with tie_word_embeddings the head is model.embed_tokens.weight and
the checkpoint (and a moepeak dump) has no lm_head.weight; one holding lm_head.weight anyway is
refused here as ambiguous.

RoPE (modeling_rope_utils.py, RotaryEmbeddingConfigMixin)
--------------------------------------------------------
Config forms: transformers 4 writes rope_theta at top level and rope_scaling {"rope_type" or
"type", ...} (or null); transformers 5 writes rope_parameters {"rope_type", "rope_theta", ...}.
transformers 5 reads both: a non-empty rope_scaling replaces rope_parameters; then rope_theta (top
level, else the family's default_theta: mixtral 1e6, qwen3_moe 1e4) and a top-level
partial_rotary_factor only fill keys the dict lacks; rope_type defaults to "type", then "default".
For yarn and llama3, original_max_position_embeddings is the top-level field when config.json has
one (the Phi3 exception of standardize_rope_params, applied when the rope init re-standardizes),
else the dict's, else max_position_embeddings. inv_freq = 1 / base^(2j/dim), j < dim/2, then:
  default  nothing more; the model's own compute_default_rope_parameters rotates all of head_dim
           and ignores partial_rotary_factor;
  linear   inv_freq / factor;
  dynamic  NTK: base' = base * (factor * L / max_pos - (factor - 1))^(dim / (dim - 2)) with
           L = max(max(position_ids) + 1, max_position_embeddings), i.e. only when a sequence is
           longer than max_position_embeddings (transformers caches the grown inv_freq between
           calls; here every call is a fresh model);
  yarn     factor null -> max_position_embeddings / original_max_position_embeddings;
           attention_factor null -> mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
           both are non-zero, else mscale(factor, 1), mscale(s, m) = 0.1 m ln s + 1 (1 for s <= 1);
           beta_fast (null/0 -> 32), beta_slow (-> 1); correction range
           dim * ln(orig / (2 pi beta)) / (2 ln base) for beta_fast (low) and beta_slow (high),
           floor/ceil when truncate (default true), clamped to [0, dim - 1]; ramp over j < dim // 2
           (high += 0.001 when equal); inv_freq mixes 1/(factor*pos_freq) and 1/pos_freq by it;
           cos and sin are multiplied by attention_factor (the softmax scale stays head_dim^-0.5:
           yarn_apply_mscale is for MLA models only);
  llama3   wavelen = 2 pi / inv_freq: > orig/low_freq_factor -> inv_freq / factor, < orig /
           high_freq_factor -> unchanged, between -> smoothed with (orig / wavelen - low) / (high -
           low).
dim = int(head_dim * partial_rotary_factor) for linear, dynamic, yarn and llama3. Mixtral's and
Qwen3-MoE's apply_rotary_pos_emb rotate the whole head, so any dim whose 2 * ceil(dim / 2) is not
head_dim fails in transformers (a shape error) and is refused here. dynamic and yarn take head_dim
as getattr(config, "head_dim", hidden // heads): a mixtral config without an integer head_dim fails
there in transformers 5.25 (TypeError) and is refused here. longrope, proportional, any other rope
type, nested per-layer-type rope_parameters, and unknown model_types raise ValueError naming the
field. transformers 4.57.6 gives the same results for transformers-4-form configs, except that it
fails on a null yarn factor and takes rope_scaling's original_max_position_embeddings over a
top-level one; it ignores rope_parameters (and qwen3_moe's num_local_experts) altogether.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

IGNORE_INDEX = -100

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

# transformers 5.25's config defaults for the fields this reference reads (a field missing from
# config.json takes these, as in MixtralConfig / Qwen3MoeConfig). transformers 5 also checks JSON
# types strictly (@strict dataclasses: 0 for a float field, 256.0 for an int field, 1 for a bool are
# load errors there); this reference converts instead.
_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "mixtral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, num_experts_per_tok=2,
                    num_experts=8, router_aux_loss_coef=0.001, output_router_logits=False,
                    tie_word_embeddings=False, sliding_window=None, hidden_act="silu"),
    "qwen3_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                      num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, num_experts_per_tok=8,
                      num_experts=128, router_aux_loss_coef=0.001, output_router_logits=False,
                      tie_word_embeddings=False, sliding_window=4096, use_sliding_window=False,
                      attention_bias=False, decoder_sparse_step=1, moe_intermediate_size=768,
                      norm_topk_prob=False, mlp_only_layers=None, hidden_act="silu"),
}
# RotaryEmbeddingConfigMixin.default_theta, overridden by MixtralConfig.
_DEFAULT_THETA = {"mixtral": 1e6, "qwen3_moe": 10000.0}
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass
class RopeParameters:
    """The RoPE parameters as transformers resolves them (see the module docstring)."""
    rope_type: str                      # one of ROPE_TYPES
    rope_theta: float
    dim: int                            # rotary dimension the formulas use (head_dim for default)
    factor: Optional[float] = None      # linear, dynamic, yarn (resolved), llama3
    original_max_position_embeddings: Optional[int] = None  # yarn, llama3
    attention_factor: float = 1.0       # yarn (resolved); 1 for the others
    beta_fast: float = 32.0             # yarn
    beta_slow: float = 1.0              # yarn
    truncate: bool = True               # yarn
    low_freq_factor: Optional[float] = None   # llama3
    high_freq_factor: Optional[float] = None  # llama3


@dataclass
class ModelConfig:
    """One model's config.json as transformers reads it, both families in one shape."""
    model_type: str                     # "mixtral" or "qwen3_moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int              # mixtral: each expert's width; qwen3_moe: dense MLP width
    moe_intermediate_size: int          # each expert's width (mixtral: = intermediate_size)
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
    sliding_window: Optional[int]       # None: plain causal attention
    norm_topk_prob: bool                # renormalise the k routing weights (mixtral: always)
    attention_bias: bool                # q/k/v/o_proj biases (mixtral: never)
    qk_norm: bool                       # per-head q_norm / k_norm (qwen3_moe)
    mlp_only_layers: Tuple[int, ...]    # qwen3_moe: layers forced dense
    decoder_sparse_step: int            # qwen3_moe: every step-th layer is MoE
    rope: RopeParameters

    @property
    def num_local_experts(self) -> int:
        """Mixtral's name for num_experts."""
        return self.num_experts

    @property
    def rope_theta(self) -> float:
        return self.rope.rope_theta

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i has a sparse MoE block (Qwen3MoeDecoderLayer's condition; every mixtral
        layer)."""
        if self.model_type == "mixtral":
            return True
        try:
            return (i not in self.mlp_only_layers) and (
                self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0)
        except ZeroDivisionError:
            raise ValueError("decoder_sparse_step = 0: transformers divides by it") from None

    @property
    def moe_layers(self) -> List[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]


def _resolve_rope(j: Dict[str, Any], model_type: str, head_dim: int, head_dim_attr: Optional[int],
                  max_pos: int, where: str) -> RopeParameters:
    """transformers 5's convert_rope_params_to_dict + standardize_rope_params + the rope init
    function's reads, for a config.json dict j (either form). head_dim_attr is what
    getattr(config, "head_dim", hidden // heads) gives (None for mixtral without a head_dim)."""
    field = "rope_scaling" if j.get("rope_scaling") else "rope_parameters"
    rp = j.get("rope_scaling") or j.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ValueError(f"{where}: {field} must be an object, got {rp!r}")
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError(f"{where}: {field} nested by layer type is not implemented by this reference")
    rp = dict(rp)
    rp.setdefault("rope_theta", j.get("rope_theta", _DEFAULT_THETA[model_type]))
    if j.get("partial_rotary_factor") is not None:
        rp.setdefault("partial_rotary_factor", j["partial_rotary_factor"])
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{where}: {field}.rope_type {rope_type!r} is not implemented by this "
                         f"reference (implemented: {', '.join(ROPE_TYPES)})")
    if rp["rope_theta"] is None:
        raise ValueError(f"{where}: {field}.rope_theta is null")
    theta = float(rp["rope_theta"])

    def need(key: str) -> Any:
        if key not in rp:
            raise ValueError(f"{where}: {field}.{key} is required for rope_type {rope_type!r}")
        return rp[key]

    if rope_type == "default":
        return RopeParameters("default", theta, head_dim)

    prf = rp.get("partial_rotary_factor", 1.0)
    if rope_type in ("dynamic", "yarn"):
        if head_dim_attr is None:
            raise ValueError(f"{where}: rope_type {rope_type!r} needs an integer head_dim "
                             f"(transformers reads getattr(config, 'head_dim', ...) and fails on null)")
        dim = int(head_dim_attr * prf)
    else:
        dim = int(head_dim * prf)
    n = len(range(0, dim, 2))  # entries of inv_freq
    if 2 * n != head_dim or (rope_type == "yarn" and dim // 2 != n):
        raise ValueError(f"{where}: {field}.partial_rotary_factor {prf}: rotary dim {dim} of head_dim "
                         f"{head_dim}; {model_type} rotates the whole head, transformers fails on this")

    orig = None
    if rope_type in ("yarn", "llama3"):
        if "original_max_position_embeddings" in j:
            orig = j["original_max_position_embeddings"]
        else:
            orig = rp.get("original_max_position_embeddings", max_pos)
        if orig is None:
            raise ValueError(f"{where}: original_max_position_embeddings is null")
        orig = int(orig)

    if rope_type == "linear" or rope_type == "dynamic":
        factor = need("factor")
        if factor is None:
            raise ValueError(f"{where}: {field}.factor is null")
        return RopeParameters(rope_type, theta, dim, factor=float(factor))
    if rope_type == "llama3":
        values = [need(k) for k in ("factor", "low_freq_factor", "high_freq_factor")]
        if any(v is None for v in values):
            raise ValueError(f"{where}: {field}.factor/low_freq_factor/high_freq_factor must not be null")
        return RopeParameters("llama3", theta, dim, factor=float(values[0]),
                              original_max_position_embeddings=orig,
                              low_freq_factor=float(values[1]), high_freq_factor=float(values[2]))
    # yarn
    factor = need("factor")
    if factor is None:
        factor = max_pos / orig
    factor = float(factor)
    attention_factor = rp.get("attention_factor")
    mscale, mscale_all_dim = rp.get("mscale"), rp.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return RopeParameters("yarn", theta, dim, factor=factor, original_max_position_embeddings=orig,
                          attention_factor=float(attention_factor),
                          beta_fast=float(rp.get("beta_fast") or 32),
                          beta_slow=float(rp.get("beta_slow") or 1),
                          truncate=bool(rp.get("truncate", True)))


def config_from_dict(j: Dict[str, Any], where: str = "config.json") -> ModelConfig:
    """A ModelConfig from a parsed config.json, with transformers 5.25's defaults for missing
    fields. Raises ValueError naming the field for what this reference does not implement."""
    model_type = j.get("model_type", "mixtral")
    if model_type not in _DEFAULTS:
        raise ValueError(f"{where}: model_type {model_type!r} is not implemented by this reference "
                         f"(implemented: {', '.join(_DEFAULTS)})")
    d = _DEFAULTS[model_type]

    def get(key: str) -> Any:
        return j.get(key, d[key])

    if get("hidden_act") != "silu":
        raise ValueError(f"{where}: hidden_act {get('hidden_act')!r}: only silu is implemented")
    hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
    # num_experts / num_local_experts: each config maps one onto the other (attribute_map).
    experts = [j[k] for k in ("num_experts", "num_local_experts") if k in j]
    if len(experts) == 2 and experts[0] != experts[1]:
        raise ValueError(f"{where}: num_experts {experts[0]} and num_local_experts {experts[1]} differ")
    num_experts = int(experts[0] if experts else d["num_experts"])
    if model_type == "mixtral":
        # MixtralConfig: head_dim defaults to None; the attention uses head_dim or hidden // heads.
        head_dim_attr = j.get("head_dim")
        head_dim = int(head_dim_attr or hidden // heads)
        kv = j.get("num_key_value_heads", d["num_key_value_heads"])
        kv = heads if kv is None else int(kv)  # MixtralConfig.__post_init__
        sliding_window = j.get("sliding_window")
        intermediate = int(get("intermediate_size"))
        moe_intermediate = intermediate
        norm_topk_prob, attention_bias, qk_norm = True, False, False
        mlp_only_layers: Tuple[int, ...] = ()
        decoder_sparse_step = 1
    else:
        # Qwen3MoeConfig has no head_dim field: getattr(config, "head_dim", hidden // heads).
        if "head_dim" in j and j["head_dim"] is None:
            raise ValueError(f"{where}: head_dim is null; qwen3_moe needs an integer or no head_dim")
        head_dim = int(j.get("head_dim", hidden // heads))
        head_dim_attr = head_dim
        if get("num_key_value_heads") is None:
            raise ValueError(f"{where}: num_key_value_heads is null")
        kv = int(get("num_key_value_heads"))
        sliding_window = get("sliding_window") if get("use_sliding_window") else None
        intermediate = int(get("intermediate_size"))
        moe_intermediate = int(get("moe_intermediate_size"))
        norm_topk_prob = bool(get("norm_topk_prob"))
        attention_bias = bool(get("attention_bias"))
        qk_norm = True
        mlp_only_layers = tuple(int(i) for i in (get("mlp_only_layers") or []))
        decoder_sparse_step = int(get("decoder_sparse_step"))
    max_pos = int(get("max_position_embeddings"))
    rope = _resolve_rope(j, model_type, head_dim, head_dim_attr, max_pos, where)
    cfg = ModelConfig(
        model_type=model_type,
        vocab_size=int(get("vocab_size")),
        hidden_size=hidden,
        intermediate_size=intermediate,
        moe_intermediate_size=moe_intermediate,
        num_hidden_layers=int(get("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        num_experts=num_experts,
        num_experts_per_tok=int(get("num_experts_per_tok")),
        max_position_embeddings=max_pos,
        rms_norm_eps=float(get("rms_norm_eps")),
        router_aux_loss_coef=float(get("router_aux_loss_coef")),
        output_router_logits=bool(get("output_router_logits")),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        sliding_window=None if sliding_window is None else int(sliding_window),
        norm_topk_prob=norm_topk_prob,
        attention_bias=attention_bias,
        qk_norm=qk_norm,
        mlp_only_layers=mlp_only_layers,
        decoder_sparse_step=decoder_sparse_step,
        rope=rope,
    )
    _ = cfg.moe_layers  # decoder_sparse_step = 0 raises here, not in the middle of a forward
    return cfg


def read_config(path: str) -> ModelConfig:
    """Reads a Hugging Face config.json (mixtral or qwen3_moe, transformers 4 or 5 form)."""
    with open(path, "r", encoding="utf-8") as f:
        return config_from_dict(json.load(f), where=path)


# ---------------------------------------------------------------------------------------------
# Tensor names
# ---------------------------------------------------------------------------------------------


def moe_names(cfg: ModelConfig, i: int) -> Tuple[str, List[Tuple[str, str, str]]]:
    """Layer i's Hub tensor names: the router weight (E, H), and per expert (gate (I, H),
    up (I, H), down (H, I))."""
    if cfg.model_type == "mixtral":
        p = f"model.layers.{i}.block_sparse_moe."
        return p + "gate.weight", [(f"{p}experts.{e}.w1.weight", f"{p}experts.{e}.w3.weight",
                                    f"{p}experts.{e}.w2.weight") for e in range(cfg.num_experts)]
    p = f"model.layers.{i}.mlp."
    return p + "gate.weight", [(f"{p}experts.{e}.gate_proj.weight", f"{p}experts.{e}.up_proj.weight",
                                f"{p}experts.{e}.down_proj.weight") for e in range(cfg.num_experts)]


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
        if cfg.is_moe_layer(i):
            gate, experts = moe_names(cfg, i)
            shapes[gate] = (cfg.num_experts, h)
            f = cfg.moe_intermediate_size
            for g, u, dn in experts:
                shapes[g] = (f, h)
                shapes[u] = (f, h)
                shapes[dn] = (h, f)
        else:
            shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
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
# The model
# ---------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """MixtralRMSNorm / Qwen3MoeRMSNorm: x * 1/sqrt(mean(x^2) + eps) * w, over the last axis."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """yarn_get_mscale: 0.1 * mscale * ln(scale) + 1, and 1 for scale <= 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(cfg: ModelConfig, seq_len: int) -> Tuple[np.ndarray, float]:
    """The rotary inverse frequencies (ceil(dim/2),) and the cos/sin scale (attention_factor) for
    a forward over positions 0..seq_len-1 (see the module docstring)."""
    r = cfg.rope
    dim, base = r.dim, r.rope_theta
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim  # 2j / dim
    if r.rope_type == "default":
        return 1.0 / (base ** exponents), 1.0
    if r.rope_type == "linear":
        return 1.0 / (base ** exponents) / r.factor, 1.0
    if r.rope_type == "dynamic":
        # transformers grows inv_freq when max(position_ids) + 1 exceeds max_position_embeddings;
        # at or below it the formula gives base itself (factor * 1 - (factor - 1) = 1).
        L = max(seq_len, cfg.max_position_embeddings)
        base = base * ((r.factor * L / cfg.max_position_embeddings) - (r.factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** exponents), 1.0
    if r.rope_type == "llama3":
        inv_freq = 1.0 / (base ** exponents)
        old_context_len = r.original_max_position_embeddings
        low_freq_wavelen = old_context_len / r.low_freq_factor
        high_freq_wavelen = old_context_len / r.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq)
        smooth = (old_context_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
        smoothed = (1 - smooth) * inv_freq_llama / r.factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(is_medium, smoothed, inv_freq_llama), 1.0
    # yarn
    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(r.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent a singularity
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_factor = 1.0 - ramp
    pos_freqs = base ** exponents
    inv_freq_interpolation = 1.0 / (r.factor * pos_freqs)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq, r.attention_factor


def rope_cos_sin(cfg: ModelConfig, seq_len: int) -> Tuple[np.ndarray, np.ndarray]:
    """The rotary embedding's cos and sin, (T, head_dim), for positions 0..T-1 of every sequence.

    freqs = position * inv_freq; emb = cat(freqs, freqs) along the last axis (the two halves
    repeat, matching rotate_half); cos and sin are scaled by the attention factor (yarn).
    """
    inv_freq, scale = rope_inv_freq(cfg, seq_len)
    positions = np.arange(seq_len, dtype=np.float64)
    freqs = np.outer(positions, inv_freq)                # (T, d/2)
    emb = np.concatenate([freqs, freqs], axis=-1)        # (T, d)
    cos, sin = np.cos(emb), np.sin(emb)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def rotate_half(x: np.ndarray) -> np.ndarray:
    """transformers' rotate_half: (x1, x2) -> (-x2, x1), halves along the last axis."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([-x2, x1], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin. x: (B, heads, T, d)."""
    return x * cos + rotate_half(x) * sin


def linear(x: np.ndarray, params: Dict[str, np.ndarray], name: str, bias: bool) -> np.ndarray:
    """nn.Linear: x @ W^T (+ b). name: the module, e.g. "...self_attn.q_proj"."""
    y = x @ params[name + ".weight"].T
    return y + params[name + ".bias"] if bias else y


def attention(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str, cfg: ModelConfig,
              cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """MixtralAttention / Qwen3MoeAttention (eager): x (B, T, H) already normalised -> o_proj
    output (B, T, H)."""
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
    return linear(out, params, prefix + "o_proj", bias)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, largest first; ties go to the lower index."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def sparse_moe(x: np.ndarray, params: Dict[str, np.ndarray], layer: int,
               cfg: ModelConfig) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: x (N, H) normalised tokens -> (output
    (N, H), router logits (N, E), selected experts (N, k))."""
    N, H = x.shape
    gate, experts = moe_names(cfg, layer)
    router_logits = x @ params[gate].T                         # (N, E)
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


def dense_mlp(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """Qwen3MoeMLP: down_proj(silu(gate_proj(x)) * up_proj(x)); x (..., H)."""
    g = x @ params[prefix + "gate_proj.weight"].T
    u = x @ params[prefix + "up_proj.weight"].T
    return (silu(g) * u) @ params[prefix + "down_proj.weight"].T


@dataclass
class ForwardResult:
    logits: np.ndarray                  # (B, T, V)
    router_logits: List[np.ndarray]     # per MoE layer, (B*T, E)
    selected_experts: List[np.ndarray]  # per MoE layer, (B*T, k)


def forward(params: Dict[str, np.ndarray], cfg: ModelConfig, input_ids: np.ndarray) -> ForwardResult:
    """The CausalLM forward without a cache: (B, T) token ids -> logits (B, T, V)."""
    check_params(params, cfg)
    input_ids = np.asarray(input_ids, dtype=np.int64)
    B, T = input_ids.shape
    h = params["model.embed_tokens.weight"][input_ids]  # (B, T, H)
    cos, sin = rope_cos_sin(cfg, T)
    router_logits, selected = [], []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rms_norm(h, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + attention(a, params, p + "self_attn.", cfg, cos, sin)
        m = rms_norm(h, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        if cfg.is_moe_layer(i):
            moe_out, logits_i, selected_i = sparse_moe(m.reshape(B * T, -1), params, i, cfg)
            h = h + moe_out.reshape(B, T, -1)
            router_logits.append(logits_i)
            selected.append(selected_i)
        else:
            h = h + dense_mlp(m, params, p + "mlp.")
    h = rms_norm(h, params["model.norm.weight"], cfg.rms_norm_eps)
    lm_head = params["model.embed_tokens.weight"] if cfg.tie_word_embeddings else params["lm_head.weight"]
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
