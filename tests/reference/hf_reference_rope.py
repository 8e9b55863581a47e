"""RoPE of the float64 numpy reference (hf_reference.py): how transformers 5.25 resolves a
config.json's rotary parameters, the inverse frequencies of every implemented rope type, and the
rotation itself. Written from modeling_rope_utils.py (RotaryEmbeddingConfigMixin and the
ROPE_INIT_FUNCTIONS); shared by every family.

Config forms: transformers 4 writes rope_theta at top level and rope_scaling {"rope_type" or
"type", ...} (or null); transformers 5 writes rope_parameters {"rope_type", "rope_theta", ...}.
transformers 5 reads both: a non-empty rope_scaling replaces rope_parameters; then rope_theta (top
level, else the family's default_theta: mixtral 1e6, qwen3_moe and deepseek_v3 1e4, gpt_oss 1.5e5)
and a top-level partial_rotary_factor only fill keys the dict lacks; rope_type defaults to "type",
then "default".
gpt_oss only: a config.json without rope_scaling and with no (or a null) rope_parameters gets
GptOssConfig's own dict, {"rope_type": "yarn", "factor": 32, "beta_fast": 32, "beta_slow": 1,
"truncate": false, "original_max_position_embeddings": 4096}, which the steps above then fill
(an empty rope_parameters {} stays empty and so means "default" there, as in the other families).
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
           floor/ceil when truncate (default true; gpt-oss's configs set false), clamped to
           [0, dim - 1]; ramp over j < dim // 2 (high += 0.001 when equal); inv_freq mixes
           1/(factor*pos_freq) and 1/pos_freq by it; cos and sin are multiplied by
           attention_factor (the softmax scale stays head_dim^-0.5: yarn_apply_mscale is for MLA
           models only, hf_reference_deepseek_v3.py applies it);
  llama3   wavelen = 2 pi / inv_freq: > orig/low_freq_factor -> inv_freq / factor, < orig /
           high_freq_factor -> unchanged, between -> smoothed with (orig / wavelen - low) / (high -
           low).
dim = int(head_dim * partial_rotary_factor) for linear, dynamic, yarn and llama3. Every family's
apply_rotary_pos_emb rotates the whole head, so any dim whose 2 * ceil(dim / 2) is not head_dim
fails in transformers (a shape error) and is refused here. dynamic and yarn take head_dim as
getattr(config, "head_dim", hidden // heads): a mixtral config without an integer head_dim fails
there in transformers 5.25 (TypeError) and is refused here. longrope, proportional, any other rope
type, and nested per-layer-type rope_parameters raise ValueError naming the field. transformers
4.57.6 gives the same results for transformers-4-form configs, except that it fails on a null yarn
factor and takes rope_scaling's original_max_position_embeddings over a top-level one; it ignores
rope_parameters altogether.

The rotation. Mixtral and Qwen3-MoE: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin) with
rotate_half (x1, x2) -> (-x2, x1) over the two halves of head_dim. gpt-oss (_apply_rotary_emb):
(x1 cos - x2 sin, x2 cos + x1 sin) with cos, sin of width head_dim / 2 — the same numbers, so
apply_rope below serves every family. deepseek_v3 rotates only the qk_rope_head_dim dims of q and
of its shared key (its config's head_dim), and with rope_interleave gathers their even then odd
dims first (hf_reference_deepseek_v3.py). transformers computes the angles in float32
(position_ids.float() * inv_freq), here in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

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


def rope_dict(j: Dict[str, Any], where: str,
              family_rope: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
    """(the config.json field it comes from, a copy of the rope dict transformers 5 starts from):
    a non-empty rope_scaling, else rope_parameters (family_rope in place of a missing or null one
    when given; {} otherwise), before rope_theta and the defaults fill it."""
    field = "rope_scaling" if j.get("rope_scaling") else "rope_parameters"
    if j.get("rope_scaling"):
        rp = j["rope_scaling"]
    elif j.get("rope_parameters") is None and family_rope is not None:
        rp = family_rope
    else:
        rp = j.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ValueError(f"{where}: {field} must be an object, got {rp!r}")
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError(f"{where}: {field} nested by layer type is not implemented by this reference")
    return field, dict(rp)


def resolve_rope(j: Dict[str, Any], model_type: str, head_dim: int, head_dim_attr: Optional[int],
                 max_pos: int, where: str, default_theta: float,
                 family_rope: Optional[Dict[str, Any]] = None) -> RopeParameters:
    """transformers 5's convert_rope_params_to_dict + standardize_rope_params + the rope init
    function's reads, for a config.json dict j (either form). head_dim_attr is what
    getattr(config, "head_dim", hidden // heads) gives (None for mixtral without a head_dim);
    family_rope is the dict the family's config puts in place of a missing or null
    rope_parameters (gpt_oss's yarn), None for an empty one."""
    field, rp = rope_dict(j, where, family_rope)
    rp.setdefault("rope_theta", j.get("rope_theta", default_theta))
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
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    return RopeParameters("yarn", theta, dim, factor=factor, original_max_position_embeddings=orig,
                          attention_factor=float(attention_factor),
                          beta_fast=float(rp.get("beta_fast") or 32),
                          beta_slow=float(rp.get("beta_slow") or 1),
                          truncate=bool(rp.get("truncate", True)))


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """yarn_get_mscale: 0.1 * mscale * ln(scale) + 1, and 1 for scale <= 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(cfg, seq_len: int) -> Tuple[np.ndarray, float]:
    """The rotary inverse frequencies (ceil(dim/2),) and the cos/sin scale (attention_factor) for
    a forward over positions 0..seq_len-1 (see the module docstring). cfg: a ModelConfig (its
    .rope and .max_position_embeddings)."""
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


def rope_cos_sin(cfg, seq_len: int, position_ids: Optional[np.ndarray] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """The rotary embedding's cos and sin, (T, head_dim), for positions 0..T-1 of every sequence
    — or, given position_ids (B, T) (packed documents whose positions restart), (B, 1, T,
    head_dim), broadcasting over the heads as transformers' position_ids do.

    freqs = position * inv_freq; emb = cat(freqs, freqs) along the last axis (the two halves
    repeat, matching rotate_half); cos and sin are scaled by the attention factor (yarn).
    """
    inv_freq, scale = rope_inv_freq(cfg, seq_len)
    if position_ids is None:
        positions = np.arange(seq_len, dtype=np.float64)
    else:
        positions = np.asarray(position_ids, dtype=np.float64)[:, None, :]  # (B, 1, T)
    freqs = positions[..., None] * inv_freq              # (T, d/2) or (B, 1, T, d/2)
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
