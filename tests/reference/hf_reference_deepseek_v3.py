"""The deepseek_v3 family (config.json model_type "deepseek_v3", and Kimi-K2's "kimi_k2") of the
float64 numpy reference (hf_reference.py): DeepseekV3ForCausalLM, written from transformers
5.25.0's modeling_deepseek_v3.py, configuration_deepseek_v3.py, modeling_rope_utils.py (yarn,
yarn_get_mscale, yarn_apply_mscale) and conversion_mapping.py; DeepSeek-V3's and Kimi-K2's
released config.json files for the fields transformers does not read.

Decoder: embed -> L x [x += mla(rms_norm(x)); x += mlp(rms_norm(x))] -> rms_norm -> lm_head;
layer i is MoE when i >= first_k_dense_replace, else a dense MLP mlp.{gate,up,down}_proj.weight of
width intermediate_size. RMSNorm eps rms_norm_eps, except the two latent norms below.

Attention (MLA; DeepseekV3Attention, eager), x (B, T, H), nh heads, dn = qk_nope_head_dim,
dr = qk_rope_head_dim, dv = v_head_dim, r = kv_lora_rank; tensors self_attn.*:
  q = q_b_proj(q_a_layernorm(q_a_proj(x)))  with q_lora_rank set (q_a_proj (q_lora_rank, H),
      q_a_layernorm (q_lora_rank,), q_b_proj (nh (dn + dr), q_lora_rank)),
  q = q_proj(x)                             with q_lora_rank null (q_proj (nh (dn + dr), H));
  q viewed (nh, dn + dr) -> q_pass (dn), q_rot (dr);
  c = kv_a_proj_with_mqa(x) (r + dr, H) -> c_kv (r), k_rot (dr): ONE rotary key, shared by all
      heads; kv = kv_b_proj(kv_a_layernorm(c_kv)) (nh (dn + dv), r) viewed (nh, dn + dv) ->
      k_nope (dn), v (dv);
  RoPE (angles over dr dims: the config's head_dim is qk_rope_head_dim) on q_rot and k_rot only;
  k = [k_nope, k_rot], q = [q_pass, q_rot]; causal softmax(q k^T * scale) v -> (nh dv) -> o_proj
  (H, nh dv).
  - q_a_layernorm and kv_a_layernorm are DeepseekV3RMSNorm(width) with its default eps 1e-6,
    NOT rms_norm_eps (DeepSeek's own modeling_deepseek.py does the same).
  - attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj get a .bias; q_proj, q_b_proj and
    kv_b_proj never do.
  - scale = qk_head_dim^-0.5 (qk_head_dim = dn + dr), times yarn_get_mscale(factor,
    mscale_all_dim)^2 when the rope dict's rope_type is not "default" and its mscale_all_dim is
    non-zero (yarn_apply_mscale; yarn_get_mscale(s, m) = 0.1 m ln s + 1, 1 for s <= 1). YaRN's
    cos/sin factor (attention_factor, from mscale / mscale_all_dim) applies too, on the rope dims
    only (hf_reference_rope.py). A null factor with a non-zero mscale_all_dim fails in
    transformers (it compares None <= 1) and is refused here.
  - rope_interleave (default true): the rope dims pair as (x0, x1), (x2, x3), ..., pair j turning
    by inv_freq[j]. transformers' apply_rotary_pos_emb_interleave writes its output
    de-interleaved ([x0 cos - x1 sin, x2 cos - x3 sin, ..., x1 cos + x0 sin, ...]); the
    reference does the same (gathers the even then the odd dims, then rotate_half's rotation).
    q and k are permuted alike, so q.k and hence everything after are as for the in-place
    interleaved rotation of DeepSeek's own code. rope_interleave false (or null): rotate_half
    over the halves of the dr dims, as Llama.
  - num_key_value_heads must equal num_attention_heads: kv_b_proj already makes nh key heads, and
    transformers' repeat_kv would repeat them nh / num_key_value_heads times (a shape error).

MoE block (DeepseekV3MoE), x (N, H) normalised, tensors mlp.*:
  router gate.weight (E, H), gate.e_score_correction_bias (E,) (a buffer in transformers: no
  gradient; trained by DeepSeek's bias update, not by the loss):
    logits = x W^T; s = sigmoid(logits); choice = s + bias;
    groups: E experts in n_group contiguous groups of E / n_group; a group's score is the sum of
    its 2 largest choice values; the topk_group best groups stay, the other experts' choice is
    -inf; selected = the top-k (num_experts_per_tok) of choice;
    weights = s[selected] (UNbiased), / (sum + 1e-20) when norm_topk_prob, times
    routed_scaling_factor.
  Ties (groups and experts) go to the lower index (hf_reference_common.top_k; torch.topk
  promises no order among equal values, sorted=False only changes the order of the k, not the
  sum). transformers computes the router in float32 (its weight and bias stay float32,
  _keep_in_fp32_modules_strict, and x is cast), here float64.
  experts: mlp.experts.{e}.{gate,up,down}_proj.weight (I, H), (I, H), (H, I), I =
  moe_intermediate_size, silu-gated, times the weight, summed over the k;
  shared experts mlp.shared_experts.{gate,up,down}_proj.weight of width moe_intermediate_size *
  n_shared_experts, on every token, added unweighted.
  Expert tensor names: transformers 5.25 fuses each layer's experts in the module
  (mlp.experts.gate_up_proj (E, 2I, H), mlp.experts.down_proj (E, H, I)) and converts on load from
  the per-expert Hub names above (conversion_mapping.py: deepseek_v3 -> the "qwen2_moe" mapping:
  MergeModulelist(dim=0) + Concatenate(dim=1) of gate_proj and up_proj); save_pretrained writes
  them back per expert. This reference takes the per-expert Hub names only.

Loss: the CE alone. DeepseekV3ForCausalLM computes no aux loss (output_router_logits only
records the router logits, index 0 of DeepseekV3TopkRouter's output: the raw x W^T), so
router_aux_loss_coef is not read. sequence_balance_loss below is DeepSeek-V3's sequence-wise
balance loss (arXiv 2412.19437, eq. 17-20), for moepeak's option: hf_reference.loss adds it only
when asked (sequence_aux_alpha). The release's config.json carries DeepSeek's own "seq_aux" and
"aux_loss_alpha", which transformers ignores and so does read_config; check_step_dump.py reads
them from a moepeak dump's config.json (moepeak writes them only when its loss is on).

Multi-token prediction (num_nextn_predict_layers N, alias num_mtp_layers; DeepseekV3Config's
default is 1): the release stores N MTP modules at model.layers.{L}.* for L = num_hidden_layers ..
+ N - 1: embed_tokens, enorm, hnorm, eh_proj (H, 2H), shared_head.norm, shared_head.head and a
whole decoder layer (input_layernorm, self_attn.*, post_attention_layernorm, mlp.*; MoE when L >=
first_k_dense_replace). DeepseekV3ForCausalLM does not build them (its
_keys_to_ignore_on_load_unexpected silences model.layers.61.* for the 61-layer release; a smaller
checkpoint's MTP keys are reported as unexpected and dropped); transformers 5.25's MtpModel loads
them separately for speculative decoding. The reference ignores them too: mtp_shapes lists them,
hf_reference.check_params accepts all of them or none, the forward never reads them.

Config fields transformers 5.25 does not read, checked here: scoring_func must be "sigmoid" and
topk_method "noaux_tc" when present (transformers always routes that way; DeepSeek-V2-style
"softmax" / "greedy" / "group_limited_greedy" checkpoints would be misread); moe_layer_freq must
be 1 when present (DeepSeek's own code also requires i % moe_layer_freq == 0 for MoE; transformers
ignores it); quantization_config, ep_size, seq_aux, aux_loss_alpha, pretraining_tp are ignored
(the FP8 weights are dequantised by hf_reference.load_params: hf_reference_fp8.py). n_group must
split the experts into equal groups of 2 or more, and num_experts_per_tok fit in the kept groups
(transformers fails on groups of 1, silently regroups the flattened tokens when n_group does not
divide the experts, and picks masked -inf experts past the kept ones). A config.json
head_dim other than qk_rope_head_dim is refused (DeepseekV3Config sets head_dim =
qk_rope_head_dim; a different value overrides it as the RoPE width and transformers fails on the
shapes). "kimi_k2" (Kimi-K2's
config.json: architectures DeepseekV3ForCausalLM, remote code) is read exactly as deepseek_v3,
with DeepseekV3Config's defaults, as Moonshot's deployment notes say (rename the model_type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from hf_reference_common import (FULL_ATTENTION, ForwardResult, ModelConfig, attention_allowed,
                                 linear, rms_norm, shared_config_fields, silu, top_k)
from hf_reference_rope import apply_rope, resolve_rope, rope_dict, yarn_get_mscale

MODEL_TYPE = "deepseek_v3"
MODEL_TYPES = ("deepseek_v3", "kimi_k2")
# DeepseekV3Config's defaults (transformers 5.25) for the fields this reference reads.
DEFAULTS: Dict[str, Any] = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
    num_experts=256, output_router_logits=False, routed_scaling_factor=2.5, kv_lora_rank=512,
    q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8,
    topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True,
    hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_interleave=True, attention_bias=False, num_nextn_predict_layers=1,
    router_aux_loss_coef=0.0)  # not a DeepseekV3Config field: no aux loss
DEFAULT_THETA = 10000.0        # RotaryEmbeddingConfigMixin.default_theta
LATENT_NORM_EPS = 1e-6         # q_a_layernorm, kv_a_layernorm: DeepseekV3RMSNorm's default eps
NORM_TOPK_EPS = 1e-20          # DeepseekV3TopkRouter: weights / (sum + 1e-20)
# The release's FP8 weights: every 2-D projection of attention, dense MLPs, shared and routed
# experts (main and MTP layers); not embeddings, norms, the router, its bias, lm_head, eh_proj or
# shared_head.head.
FP8_WEIGHT = re.compile(r"\.(self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                        r"|mlp\.(shared_experts\.|experts\.\d+\.)?(gate_proj|up_proj|down_proj))\.weight$")


@dataclass
class DeepseekFields:
    """The deepseek_v3 config fields ModelConfig has no place for (ModelConfig.family_fields)."""
    q_lora_rank: Optional[int]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool
    softmax_scale: float        # yarn_apply_mscale(rope dict, qk_head_dim^-0.5)
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    n_shared_experts: int
    first_k_dense_replace: int
    num_nextn_predict_layers: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _alias(j: Dict[str, Any], keys: Tuple[str, ...], default: Any, where: str) -> Any:
    """A field with attribute_map aliases: the value of whichever key is present (equal values
    when several are), else the default."""
    present = [(k, j[k]) for k in keys if k in j]
    if len({repr(v) for _, v in present}) > 1:
        raise ValueError(f"{where}: {' and '.join(f'{k} {v!r}' for k, v in present)} differ")
    return present[0][1] if present else default


def _not_null(j: Dict[str, Any], key: str, where: str) -> Any:
    value = j.get(key, DEFAULTS[key])
    if value is None:
        raise ValueError(f"{where}: {key} is null; transformers' DeepseekV3 needs an integer")
    return value


def config_from_dict(j: Dict[str, Any], where: str) -> ModelConfig:
    """A deepseek_v3 / kimi_k2 ModelConfig from a parsed config.json (DeepseekV3Config's defaults
    for missing fields; see the module docstring for what is refused)."""
    model_type = j.get("model_type", MODEL_TYPE)
    if j.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {j['hidden_act']!r}: only silu is implemented")
    for key, only in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1)):
        if key in j and j[key] != only:
            raise ValueError(f"{where}: {key} {j[key]!r}: transformers' DeepseekV3 implements only "
                             f"{only!r} (it ignores the field), and so does this reference")
    experts = _alias(j, ("n_routed_experts", "num_local_experts"), DEFAULTS["num_experts"], where)
    if experts is None:
        raise ValueError(f"{where}: n_routed_experts is null")
    experts = int(experts)
    shared_j = {k: v for k, v in j.items() if k not in ("num_experts", "num_local_experts")}
    shared_j["num_local_experts"] = experts
    shared = shared_config_fields(shared_j, model_type, DEFAULTS, where)
    heads, layers = shared["num_attention_heads"], shared["num_hidden_layers"]
    kv = j.get("num_key_value_heads", DEFAULTS["num_key_value_heads"])
    kv = heads if kv is None else int(kv)  # DeepseekV3Config.__post_init__
    if kv != heads:
        raise ValueError(f"{where}: num_key_value_heads {kv} != num_attention_heads {heads}: MLA makes "
                         f"one key per head, and transformers' repeat_kv fails on this")
    ints = {k: int(_not_null(j, k, where)) for k in (
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group", "topk_group",
        "num_experts_per_tok", "first_k_dense_replace", "n_shared_experts", "intermediate_size",
        "moe_intermediate_size")}
    q_lora_rank = j.get("q_lora_rank", DEFAULTS["q_lora_rank"])
    q_lora_rank = None if q_lora_rank is None else int(q_lora_rank)
    dr, k = ints["qk_rope_head_dim"], ints["num_experts_per_tok"]
    groups, keep = ints["n_group"], ints["topk_group"]
    if dr <= 0 or dr % 2:
        raise ValueError(f"{where}: qk_rope_head_dim {dr} must be even and positive")
    if "head_dim" in j and j["head_dim"] != dr:
        raise ValueError(f"{where}: head_dim {j['head_dim']!r} != qk_rope_head_dim {dr}; DeepseekV3Config "
                         f"sets head_dim = qk_rope_head_dim (the RoPE width)")
    if groups <= 0 or experts % groups or experts // groups < 2:
        raise ValueError(f"{where}: n_group {groups} must divide n_routed_experts {experts} into groups "
                         f"of 2 or more (each group scores the sum of its top 2)")
    if not 1 <= keep <= groups or not 1 <= k <= keep * (experts // groups):
        raise ValueError(f"{where}: topk_group {keep} of n_group {groups} and num_experts_per_tok {k}: "
                         f"need 1 <= topk_group <= n_group and 1 <= k <= topk_group * group size")
    if ints["n_shared_experts"] < 1:
        raise ValueError(f"{where}: n_shared_experts {ints['n_shared_experts']}: at least 1 is implemented")
    nextn = int(_alias(j, ("num_nextn_predict_layers", "num_mtp_layers"),
                       DEFAULTS["num_nextn_predict_layers"], where) or 0)
    max_pos = shared["max_position_embeddings"]
    rope = resolve_rope(j, model_type, dr, dr, max_pos, where, DEFAULT_THETA)
    fields = DeepseekFields(
        q_lora_rank=q_lora_rank, kv_lora_rank=ints["kv_lora_rank"], qk_nope_head_dim=ints["qk_nope_head_dim"],
        qk_rope_head_dim=dr, v_head_dim=ints["v_head_dim"],
        rope_interleave=bool(j.get("rope_interleave", DEFAULTS["rope_interleave"])),
        softmax_scale=softmax_scale(j, ints["qk_nope_head_dim"] + dr, where),
        n_group=groups, topk_group=keep,
        routed_scaling_factor=float(_not_null(j, "routed_scaling_factor", where)),
        n_shared_experts=ints["n_shared_experts"], first_k_dense_replace=ints["first_k_dense_replace"],
        num_nextn_predict_layers=nextn)
    shared.update(output_router_logits=False, router_aux_loss_coef=0.0)  # no aux loss (docstring)
    return ModelConfig(
        **shared,
        intermediate_size=ints["intermediate_size"],
        moe_intermediate_size=ints["moe_intermediate_size"],
        num_key_value_heads=kv,
        head_dim=dr,  # DeepseekV3Config.head_dim: the RoPE width
        sliding_window=None,
        layer_types=(FULL_ATTENTION,) * layers,
        moe_layer_flags=tuple(i >= fields.first_k_dense_replace for i in range(layers)),
        norm_topk_prob=bool(j.get("norm_topk_prob", DEFAULTS["norm_topk_prob"])),
        attention_bias=bool(j.get("attention_bias", DEFAULTS["attention_bias"])),
        qk_norm=False,
        rope=rope,
        family_fields=fields,
    )


def softmax_scale(j: Dict[str, Any], qk_head_dim: int, where: str) -> float:
    """yarn_apply_mscale(config.rope_parameters, qk_head_dim ** -0.5) for config.json j."""
    scale = qk_head_dim ** -0.5
    _, rp = rope_dict(j, where)
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    mscale_all_dim = rp.get("mscale_all_dim") or 0
    if rope_type != "default" and mscale_all_dim:
        factor = rp.get("factor")
        if factor is None:
            raise ValueError(f"{where}: rope factor missing or null with mscale_all_dim "
                             f"{mscale_all_dim}: transformers' yarn_apply_mscale fails on it")
        m = yarn_get_mscale(float(factor), float(mscale_all_dim))
        scale = scale * m * m
    return scale


# ---------------------------------------------------------------------------------------------
# Tensor names
# ---------------------------------------------------------------------------------------------


def _is_moe(cfg: ModelConfig, i: int) -> bool:
    """DeepseekV3DecoderLayer's rule, also for the MTP layers' indices past num_hidden_layers."""
    return i >= cfg.family_fields.first_k_dense_replace


def attention_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's MLA tensors (Hub names) and their shapes."""
    f, h, nh = cfg.family_fields, cfg.hidden_size, cfg.num_attention_heads
    a = f"model.layers.{i}.self_attn."
    shapes: Dict[str, Tuple[int, ...]] = {}
    if f.q_lora_rank is None:
        shapes[a + "q_proj.weight"] = (nh * f.qk_head_dim, h)
    else:
        shapes[a + "q_a_proj.weight"] = (f.q_lora_rank, h)
        if cfg.attention_bias:
            shapes[a + "q_a_proj.bias"] = (f.q_lora_rank,)
        shapes[a + "q_a_layernorm.weight"] = (f.q_lora_rank,)
        shapes[a + "q_b_proj.weight"] = (nh * f.qk_head_dim, f.q_lora_rank)
    shapes[a + "kv_a_proj_with_mqa.weight"] = (f.kv_lora_rank + f.qk_rope_head_dim, h)
    if cfg.attention_bias:
        shapes[a + "kv_a_proj_with_mqa.bias"] = (f.kv_lora_rank + f.qk_rope_head_dim,)
    shapes[a + "kv_a_layernorm.weight"] = (f.kv_lora_rank,)
    shapes[a + "kv_b_proj.weight"] = (nh * (f.qk_nope_head_dim + f.v_head_dim), f.kv_lora_rank)
    shapes[a + "o_proj.weight"] = (h, nh * f.v_head_dim)
    if cfg.attention_bias:
        shapes[a + "o_proj.bias"] = (h,)
    return shapes


def _dense_shapes(prefix: str, h: int, width: int) -> Dict[str, Tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (width, h), prefix + "up_proj.weight": (width, h),
            prefix + "down_proj.weight": (h, width)}


def mlp_shapes(cfg: ModelConfig, i: int) -> Dict[str, Tuple[int, ...]]:
    """Layer i's MLP tensors: the dense MLP, or the router (weight, bias), the experts one by one
    and the shared experts."""
    f, h, p = cfg.family_fields, cfg.hidden_size, f"model.layers.{i}.mlp."
    if not _is_moe(cfg, i):
        return _dense_shapes(p, h, cfg.intermediate_size)
    e, width = cfg.num_experts, cfg.moe_intermediate_size
    shapes: Dict[str, Tuple[int, ...]] = {p + "gate.weight": (e, h), p + "gate.e_score_correction_bias": (e,)}
    for x in range(e):
        shapes.update(_dense_shapes(f"{p}experts.{x}.", h, width))
    shapes.update(_dense_shapes(p + "shared_experts.", h, width * f.n_shared_experts))
    return shapes


def mtp_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """The MTP modules' tensors (DeepSeek's release names) and shapes, module by module; the
    reference and transformers' DeepseekV3ForCausalLM ignore them."""
    h, v = cfg.hidden_size, cfg.vocab_size
    shapes: Dict[str, Tuple[int, ...]] = {}
    first = cfg.num_hidden_layers
    for i in range(first, first + cfg.family_fields.num_nextn_predict_layers):
        p = f"model.layers.{i}."
        shapes[p + "embed_tokens.weight"] = (v, h)
        shapes[p + "enorm.weight"] = (h,)
        shapes[p + "hnorm.weight"] = (h,)
        shapes[p + "eh_proj.weight"] = (h, 2 * h)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes.update(attention_shapes(cfg, i))
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes.update(mlp_shapes(cfg, i))
        shapes[p + "shared_head.norm.weight"] = (h,)
        shapes[p + "shared_head.head.weight"] = (v, h)
    return shapes


def fp8_quantised(name: str) -> bool:
    """Whether DeepSeek's FP8 release stores tensor `name` as float8_e4m3fn with a
    <name>_scale_inv (FP8_WEIGHT)."""
    return FP8_WEIGHT.search(name) is not None


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), written with tanh so that no exp overflows."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def deinterleave(x: np.ndarray) -> np.ndarray:
    """(..., d): the even dims, then the odd ones: the interleaved pairs (x0, x1), (x2, x3), ...
    become rotate_half's (x_j, x_{j + d/2})."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def attention(x: np.ndarray, params: Dict[str, np.ndarray], layer: int, cfg: ModelConfig,
              cos: np.ndarray, sin: np.ndarray,
              document_starts: Optional[np.ndarray] = None) -> np.ndarray:
    """Layer `layer`'s DeepseekV3Attention (eager): x (B, T, H) already normalised -> o_proj
    output (B, T, H). cos, sin: (T, qk_rope_head_dim) or (B, 1, T, qk_rope_head_dim);
    document_starts: see hf_reference_common.attention_allowed."""
    f = cfg.family_fields
    a = f"model.layers.{layer}.self_attn."
    B, T, _ = x.shape
    nh, r = cfg.num_attention_heads, f.kv_lora_rank
    dn, dr, dv = f.qk_nope_head_dim, f.qk_rope_head_dim, f.v_head_dim
    bias = cfg.attention_bias
    if f.q_lora_rank is None:
        q = linear(x, params, a + "q_proj", False)
    else:
        q_latent = rms_norm(linear(x, params, a + "q_a_proj", bias), params[a + "q_a_layernorm.weight"],
                            LATENT_NORM_EPS)
        q = linear(q_latent, params, a + "q_b_proj", False)
    q = q.reshape(B, T, nh, dn + dr).transpose(0, 2, 1, 3)        # (B, nh, T, dn + dr)
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    compressed = linear(x, params, a + "kv_a_proj_with_mqa", bias)  # (B, T, r + dr)
    kv_latent = rms_norm(compressed[..., :r], params[a + "kv_a_layernorm.weight"], LATENT_NORM_EPS)
    k_rot = compressed[:, None, :, r:]                              # (B, 1, T, dr): one for all heads
    if f.rope_interleave:
        q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
    q_rot = apply_rope(q_rot, cos, sin)
    k_rot = apply_rope(k_rot, cos, sin)
    kv = linear(kv_latent, params, a + "kv_b_proj", False).reshape(B, T, nh, dn + dv).transpose(0, 2, 1, 3)
    k_nope, v = kv[..., :dn], kv[..., dn:]                          # (B, nh, T, dn), (B, nh, T, dv)
    k = np.concatenate([k_nope, np.broadcast_to(k_rot, (B, nh, T, dr))], axis=-1)
    q = np.concatenate([q_pass, q_rot], axis=-1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * f.softmax_scale       # (B, nh, Tq, Tk)
    scores = np.where(attention_allowed(T, None, document_starts), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, nh * dv)
    return linear(out, params, a + "o_proj", bias)


def dense_mlp(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """DeepseekV3MLP: down_proj(silu(gate_proj(x)) * up_proj(x)); x (..., H)."""
    g = x @ params[prefix + "gate_proj.weight"].T
    u = x @ params[prefix + "up_proj.weight"].T
    return (silu(g) * u) @ params[prefix + "down_proj.weight"].T


def route(x: np.ndarray, params: Dict[str, np.ndarray], prefix: str, cfg: ModelConfig
          ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepseekV3TopkRouter: x (N, H) -> (router logits (N, E) = x W^T, selected experts (N, k),
    routing weights (N, k)). prefix: "model.layers.{i}.mlp.". See the module docstring."""
    f = cfg.family_fields
    logits = x @ params[prefix + "gate.weight"].T                       # (N, E)
    scores = sigmoid(logits)
    choice = scores + params[prefix + "gate.e_score_correction_bias"]
    N, E = choice.shape
    grouped = choice.reshape(N, f.n_group, E // f.n_group)
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)     # (N, n_group): top-2 sums
    kept = top_k(group_scores, f.topk_group)                            # (N, topk_group)
    group_mask = np.zeros((N, f.n_group), dtype=bool)
    np.put_along_axis(group_mask, kept, True, axis=-1)
    expert_mask = np.repeat(group_mask, E // f.n_group, axis=1)         # (N, E)
    selected = top_k(np.where(expert_mask, choice, -np.inf), cfg.num_experts_per_tok)
    weights = np.take_along_axis(scores, selected, axis=-1)             # unbiased scores
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + NORM_TOPK_EPS)
    return logits, selected, weights * f.routed_scaling_factor


def mlp(x: np.ndarray, params: Dict[str, np.ndarray], i: int, cfg: ModelConfig
        ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray], None]:
    """Layer i's DeepseekV3MoE or DeepseekV3MLP: x (B, T, H) -> (output (B, T, H), router logits
    (B*T, E) or None, selected experts (B*T, k) or None, None: no clamps)."""
    p = f"model.layers.{i}.mlp."
    if not _is_moe(cfg, i):
        return dense_mlp(x, params, p), None, None, None
    B, T, H = x.shape
    tokens_x = x.reshape(B * T, H)
    logits, selected, weights = route(tokens_x, params, p, cfg)
    out = np.zeros((B * T, H), dtype=x.dtype)
    for e in range(cfg.num_experts):
        tokens, slot = np.nonzero(selected == e)
        if tokens.size == 0:
            continue
        ye = dense_mlp(tokens_x[tokens], params, f"{p}experts.{e}.")
        out[tokens] += ye * weights[tokens, slot][:, None]  # index_add_ of the weighted outputs
    out += dense_mlp(tokens_x, params, p + "shared_experts.")
    return out.reshape(B, T, H), logits, selected, None


def describe(cfg: ModelConfig) -> List[str]:
    """What check_step_dump.py's one-line description adds for this family."""
    f = cfg.family_fields
    q = "q_proj" if f.q_lora_rank is None else f"q_lora {f.q_lora_rank}"
    return [f"MLA {q} kv_lora {f.kv_lora_rank} nope/rope/v {f.qk_nope_head_dim}/{f.qk_rope_head_dim}/"
            f"{f.v_head_dim}{' interleaved' if f.rope_interleave else ''}",
            f"sigmoid routing, {f.topk_group} of {f.n_group} groups, scale {f.routed_scaling_factor:g}",
            f"{f.n_shared_experts} shared expert(s)"]


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3's sequence-wise balance loss (not part of transformers' loss)
# ---------------------------------------------------------------------------------------------


def sequence_balance_loss(result: ForwardResult, batch_size: int, num_experts: int, top_k_: int,
                          alpha: float) -> float:
    """DeepSeek-V3's complementary sequence-wise balance loss (arXiv 2412.19437, eq. 17-20) of a
    forward's routers: result.router_logits (per MoE layer (B*T, E), raw x W^T) and
    result.selected_experts (per MoE layer (B*T, k), the experts the router actually chose: top-k
    of the biased, group-limited scores). Per MoE layer and per sequence b (its T tokens, every
    position, labelled or not):
        f_i = E / (k T) * #{t : expert i among t's selected}
        P_i = 1/T sum_t s_{i,t} / sum_j s_{j,t},  s = sigmoid(logits) (unbiased, all E experts)
        L_b = alpha * sum_i f_i P_i
    and the loss is the MEAN of L_b over the B sequences, SUMMED over the MoE layers. f is
    treated as a constant (it is a count); the gradient flows through P only. (The shape of
    DeepSeek-V2's seq_aux code, ce = counts / (T k / E), (ce * mean_t scores).sum(1).mean() *
    alpha, with V3's sigmoid scores normalised per token.) transformers has no such loss.
    """
    total = 0.0
    for logits, selected in zip(result.router_logits, result.selected_experts):
        n, e = logits.shape
        if n % batch_size or e != num_experts:
            raise ValueError(f"router logits {logits.shape} for batch {batch_size} and {num_experts} experts")
        T = n // batch_size
        s = sigmoid(logits).reshape(batch_size, T, e)
        p = (s / s.sum(axis=-1, keepdims=True)).mean(axis=1)                 # (B, E)
        counts = np.zeros((batch_size, e))
        chosen = selected.reshape(batch_size, T * selected.shape[-1])
        for b in range(batch_size):
            counts[b] = np.bincount(chosen[b], minlength=e)
        f = counts * (num_experts / (top_k_ * T))                             # (B, E)
        total += alpha * float(np.mean(np.sum(f * p, axis=-1)))
    return total
