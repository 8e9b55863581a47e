#!/usr/bin/python3
"""Hugging Face checkpoints in and out of moepeak, against the float64 numpy reference of
transformers' MoE causal LMs (hf_reference.py: mixtral, qwen3_moe, gpt_oss, deepseek_v3 and
kimi_k2). Used by run_hf_roundtrip.sh.

    hf_roundtrip.py make DIR --form 4|5 --dtype F32|BF16|F16 --files N [--seed S]
                    [--model-type mixtral|qwen3_moe|gpt_oss|deepseek_v3|kimi_k2]
                    [--set KEY=JSON ...] [--fp8 BLOCK] [--mtp N]
        Writes a Hugging Face directory of random weights (std 0.2; norms 1 + that) for a small
        model of the family (default mixtral): config.json in the transformers 4 form (rope_theta
        at top level, torch_dtype, head_dim spelled out; qwen3_moe: rope_scaling null and
        num_experts, as the Hub's Qwen3 configs; gpt_oss: rope_scaling yarn as the Hub's gpt-oss
        configs) or the 5 form (rope_parameters with rope_type and rope_theta, dtype; mixtral:
        "head_dim": null; qwen3_moe: num_local_experts, which is what transformers 5.25's
        save_pretrained writes for Qwen3MoeConfig), the weights under their Hub names
        (hf_reference.param_shapes; gpt_oss: the fused experts.gate_up_proj (E, H, 2I), gate and up
        interleaved, experts.down_proj (E, I, H) and their biases) in one model.safetensors (N = 1)
        or N files with model.safetensors.index.json. Each --set puts KEY = the JSON value (a bare
        word is a string) into config.json last, e.g. --set mlp_only_layers=[1] --set
        tie_word_embeddings=true --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0}'; the
        tensors follow the config. gpt_oss: unless --set gives layer_types, they alternate
        sliding, full, ... over the (possibly --set) num_hidden_layers, as GptOssConfig's default.
        deepseek_v3 / kimi_k2 (DEEPSEEK_SHAPE; form 4 is DeepSeek-V3's released config.json, form 5
        transformers 5.25's; the per-expert names mlp.experts.{e}.{gate,up,down}_proj.weight, the
        router's mlp.gate.e_score_correction_bias drawn like the rest, std 0.2):
          --fp8 BLOCK  the FP8 release layout (hf_reference_fp8.py): every 2-D projection of
                       attention, dense MLPs, shared and routed experts (MTP layers' too; not
                       embeddings, norms, router, bias, lm_head, eh_proj, shared_head.head) as
                       F8_E4M3 codes with an F32 <name>_scale_inv of BLOCK x BLOCK blocks (partial
                       at the edges), and config.json's quantization_config {"activation_scheme":
                       "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size":
                       [BLOCK, BLOCK]}, as DeepSeek's. The checkpoint's weights are the fp32
                       products code value * scale (hf_reference.load_params dequantises them),
                       not the random draws they encode. The other tensors are in --dtype.
          --mtp N      num_nextn_predict_layers = N and N random MTP modules at
                       model.layers.{num_hidden_layers + j}.* (hf_reference.mtp_shapes: DeepSeek's
                       names), drawn after the model's tensors (same seed, same model weights).
    hf_roundtrip.py check HF_DIR DUMP_DIR
        HF_DIR is what moepeak started from (a directory made above, or a `moepeak export`);
        DUMP_DIR its step-1 dump (`train --init-from HF_DIR --dump-step DUMP_DIR`). Checks that
        (1) the dump's weights are HF_DIR's, converted to float32 exactly (BF16 and F16 widen
        without rounding), and (2) the float64 reference loss of HF_DIR's weights on the dump's
        batch equals the dump's loss within LOSS_REL_TOL (check_step_dump.py's bound and reasons).
        HF_DIR's FP8 weights count as their dequantised fp32 values; its MTP tensors, which the
        loss does not read, are compared only when the dump holds them.
    hf_roundtrip.py bf16 EXPORT_F32 EXPORT_BF16
        Every weight of EXPORT_BF16 is the round-to-nearest-even bfloat16 of EXPORT_F32's.
    hf_roundtrip.py mtp HF_DIR OTHER_DIR
        HF_DIR's MTP modules (exactly its config's hf_reference.mtp_shapes names, plus their
        _scale_inv when FP8) are in OTHER_DIR (e.g. a `moepeak export` of a run started from
        HF_DIR) with the same dtype, shape and bytes, and OTHER_DIR has no other MTP tensor.
Exits 0 when every check passes, 1 otherwise (printing what differs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
from typing import Dict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

LOSS_REL_TOL = 1e-5  # as check_step_dump.py: float32 forward vs float64 reference

# The mixtral model of the hand-made checkpoints: every feature the loss depends on visibly (GQA
# 4/2, 4 experts top-2, 2 layers), with head_dim derived from hidden / heads so that the
# transformers 5 form's "head_dim": null is exercised.
SHAPE = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
             num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-5)
# The qwen3_moe model: as Qwen3-30B-A3B in kind (head_dim 16 != hidden / heads = 8, q/k norms,
# norm_topk_prob, every layer MoE, no attention biases, untied head), GQA 4/2, 4 experts top-2;
# the expert count's key depends on the form (num_experts / num_local_experts). Dense layers, tied
# embeddings, biases, RoPE scaling: --set.
QWEN3_SHAPE = dict(vocab_size=48, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-6)
QWEN3_EXPERTS = 4
# The gpt_oss model: as gpt-oss-20b in kind (head_dim 16 != hidden / heads = 8, attention biases
# and sinks, sliding (window 4 < the tests' 16 tokens) and full layers, biased router, fused
# experts with biases, YaRN with truncate false, untied head), GQA 4/2, 4 experts top-2. The YaRN
# is gpt-oss's scaled down (factor 32 over 64 original positions instead of 4096, max positions
# 64 * 32) so that its ramp moves the 16-dim heads' frequencies; swiglu_limit 1.0 instead of 7.0
# so that the clamps bind for a good share of the std-0.2 weights' activations (transformers 5.25
# reads it; 4.57 hard-codes 7.0).
GPT_OSS_SHAPE = dict(vocab_size=48, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                     num_experts_per_tok=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
                     sliding_window=4, swiglu_limit=1.0)
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 64}
ROPE_THETA = 5000.0
# The deepseek_v3 model: as DeepSeek-V3 in kind (MLA with a q LoRA, interleaved RoPE, YaRN with
# mscale = mscale_all_dim as released, a dense first layer, sigmoid group-limited routing with a
# correction bias, a shared expert, untied head), scaled down: 3 layers (first_k_dense_replace
# 1), 8 experts in 4 groups, 2 groups kept, top-2, 4 heads, q_lora_rank 16, kv_lora_rank 12,
# nope/rope/v head dims 8/4/6. The YaRN ramp moves the 4 rope dims' second frequency (64
# original positions). rms_norm_eps 0.01, far from the latent norms' fixed 1e-6 (q_a_layernorm,
# kv_a_layernorm), so that reading rms_norm_eps there moves the loss visibly. --fp8 9 gives every
# projection partial edge blocks (no dimension is a multiple of 9).
DEEPSEEK_SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                      n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                      n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                      norm_topk_prob=True, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8,
                      qk_rope_head_dim=4, v_head_dim=6, rope_interleave=True,
                      max_position_embeddings=256, rms_norm_eps=0.01)
DEEPSEEK_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
DEEPSEEK_THETA = 10000.0
DEEPSEEK_TYPES = ("deepseek_v3", "kimi_k2")


def make_config(model_type: str, form: int, dtype: str) -> Dict:
    """config.json of the hand-made checkpoint (before --set), in transformers' form 4 or 5."""
    torch_dtype = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    if model_type == "mixtral":
        config = dict(SHAPE, architectures=["MixtralForCausalLM"], model_type="mixtral",
                      hidden_act="silu", tie_word_embeddings=False, sliding_window=None,
                      router_aux_loss_coef=0.02, output_router_logits=False, initializer_range=0.02)
        if form == 4:
            config.update(rope_theta=ROPE_THETA, torch_dtype=torch_dtype,
                          head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                          transformers_version="4.46.0")
        else:
            config.update(rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                          dtype=torch_dtype, head_dim=None, transformers_version="5.0.0")
        return config
    if model_type == "gpt_oss":
        config = dict(GPT_OSS_SHAPE, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                      hidden_act="silu", attention_bias=True, attention_dropout=0.0,
                      layer_types=gpt_oss_layer_types(GPT_OSS_SHAPE["num_hidden_layers"]),
                      tie_word_embeddings=False, router_aux_loss_coef=0.9, output_router_logits=False,
                      initializer_range=0.02)
        if form == 4:
            config.update(rope_theta=ROPE_THETA, rope_scaling=dict(GPT_OSS_YARN), torch_dtype=torch_dtype,
                          transformers_version="4.55.0")
        else:
            config.update(rope_parameters=dict(GPT_OSS_YARN, rope_theta=ROPE_THETA), dtype=torch_dtype,
                          transformers_version="5.25.0")
        return config
    if model_type in DEEPSEEK_TYPES:
        return deepseek_config(model_type, form, torch_dtype)
    config = dict(QWEN3_SHAPE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                  hidden_act="silu", attention_bias=False, attention_dropout=0.0,
                  decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                  tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                  router_aux_loss_coef=0.02, output_router_logits=False, initializer_range=0.02)
    if form == 4:
        config.update(num_experts=QWEN3_EXPERTS, rope_theta=ROPE_THETA, rope_scaling=None,
                      torch_dtype=torch_dtype, transformers_version="4.57.6")
    else:
        config.update(num_local_experts=QWEN3_EXPERTS,
                      rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                      dtype=torch_dtype, transformers_version="5.25.0")
    return config


def deepseek_config(model_type: str, form: int, torch_dtype: str) -> Dict:
    """config.json of a deepseek_v3 / kimi_k2 checkpoint. Form 4 is the released one (DeepSeek-V3's
    fields transformers does not read: scoring_func, topk_method, moe_layer_freq, aux_loss_alpha,
    seq_aux, ep_size; rope_theta and rope_scaling {"type": "yarn", ...}; num_nextn_predict_layers
    0 unless --mtp); form 5 is what transformers 5.25's save_pretrained writes (rope_parameters,
    num_nextn_predict_layers, head_dim and qk_head_dim, no release-only fields). kimi_k2:
    Kimi-K2's model_type, and its ungrouped routing (n_group = topk_group = 1)."""
    config = dict(DEEPSEEK_SHAPE, architectures=["DeepseekV3ForCausalLM"], model_type=model_type,
                  hidden_act="silu", attention_bias=False, attention_dropout=0.0,
                  tie_word_embeddings=False, num_nextn_predict_layers=0, initializer_range=0.02)
    if model_type == "kimi_k2":
        config.update(n_group=1, topk_group=1)
    if form == 4:
        config.update(rope_theta=DEEPSEEK_THETA, rope_scaling=dict(DEEPSEEK_YARN), torch_dtype=torch_dtype,
                      scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1,
                      aux_loss_alpha=0.001, seq_aux=True, ep_size=1, transformers_version="4.33.1")
    else:
        rope = {("rope_type" if k == "type" else k): v for k, v in DEEPSEEK_YARN.items()}
        config.update(rope_parameters=dict(rope, rope_theta=DEEPSEEK_THETA), dtype=torch_dtype,
                      head_dim=config["qk_rope_head_dim"],
                      qk_head_dim=config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
                      transformers_version="5.25.0")
    return config


def gpt_oss_layer_types(layers: int):
    """GptOssConfig's default layer_types: sliding on even layers, full on odd."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]


def parse_set(item: str):
    """KEY=JSON (a value that is not JSON is taken as a string)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set {item!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch's .to(torch.bfloat16) (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: str, tensors: Dict[str, tuple]) -> None:
    """tensors: name -> (safetensors dtype, shape, raw bytes)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, (_, _, raw) in tensors.items():
            f.write(raw)


def encode(x: np.ndarray, dtype: str) -> bytes:
    """float32 values as safetensors bytes of dtype F32, F16 or BF16 (nearest even)."""
    if dtype == "F32":
        return x.tobytes()
    if dtype == "F16":
        return x.astype(np.float16).tobytes()
    return float32_to_bf16_bits(x).tobytes()


def make(args) -> int:
    deepseek = args.model_type in DEEPSEEK_TYPES
    if (args.fp8 or args.mtp) and not deepseek:
        print("make: --fp8 and --mtp are for --model-type deepseek_v3 / kimi_k2", file=sys.stderr)
        return 2
    config = make_config(args.model_type, args.form, args.dtype)
    if args.mtp:
        config["num_nextn_predict_layers"] = args.mtp
    if args.fp8:
        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "weight_block_size": [args.fp8, args.fp8]}
    for key, value in args.set:
        config[key] = value
    if args.model_type == "gpt_oss" and "layer_types" not in dict(args.set):
        config["layer_types"] = gpt_oss_layer_types(int(config["num_hidden_layers"]))
    cfg = ref.config_from_dict(config, where="the config to write")
    shapes = ref.param_shapes(cfg)
    shapes.update(ref.mtp_shapes(cfg) if args.mtp else {})  # drawn after the model's
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)

    rng = np.random.default_rng(args.seed)
    files = [dict() for _ in range(args.files)]
    for k, (name, shape) in enumerate(shapes.items()):
        x = rng.normal(0.0, 0.2, size=shape).astype(np.float32)
        if name.endswith("norm.weight"):
            x = (1.0 + x).astype(np.float32)
        if args.fp8 and ref.hf_reference_deepseek_v3.fp8_quantised(name):
            # float8_e4m3fn codes and their fp32 block scales (hf_reference_fp8.py); the model's
            # weight is their fp32 product, which hf_reference.load_params reads back.
            codes, scale_inv = ref.hf_reference_fp8.block_quantize(x, (args.fp8, args.fp8))
            files[k % args.files][name] = ("F8_E4M3", shape, codes.tobytes())
            files[k % args.files][name + "_scale_inv"] = ("F32", scale_inv.shape, scale_inv.tobytes())
            continue
        files[k % args.files][name] = (args.dtype, shape, encode(x, args.dtype))
    if args.files == 1:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), files[0])
        return 0
    weight_map, total = {}, 0
    for k, tensors in enumerate(files):
        file = f"model-{k + 1:05d}-of-{args.files:05d}.safetensors"
        write_safetensors(os.path.join(args.dir, file), tensors)
        for name, (_, _, raw) in tensors.items():
            weight_map[name] = file
            total += len(raw)
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return 0


def check(args) -> int:
    failures = 0
    cfg = ref.read_config(os.path.join(args.hf_dir, "config.json"))
    hf = ref.load_params(args.hf_dir)  # FP8 weights dequantised (fp32 products)
    dumped = ref.load_params(os.path.join(args.dump_dir, "model.safetensors"))
    mtp = set(ref.mtp_shapes(cfg)) & set(hf)
    if mtp and not mtp & set(dumped):  # the loss does not read them; `mtp` compares exports
        print(f"# {len(mtp)} MTP tensors of {args.hf_dir} are not in the dump: not compared")
        hf = {n: t for n, t in hf.items() if n not in mtp}
    if set(hf) != set(dumped):
        print(f"FAIL: tensor names differ: {sorted(set(hf) ^ set(dumped))[:5]}")
        return 1
    for name in sorted(hf):
        # Both sides are float32-representable values; the dump is what moepeak loaded.
        if not np.array_equal(hf[name].astype(np.float32), dumped[name].astype(np.float32)):
            diff = np.max(np.abs(hf[name] - dumped[name]))
            print(f"FAIL: {name}: the dump's weights differ from {args.hf_dir}'s (max {diff:.3e})")
            failures += 1
    batch = ref.read_safetensors(os.path.join(args.dump_dir, "batch.safetensors"))
    with open(os.path.join(args.dump_dir, "loss.json"), encoding="utf-8") as f:
        moepeak_loss = float(json.load(f)["loss"])
    reference = ref.loss(hf, cfg, np.asarray(batch["input_ids"], dtype=np.int64),
                         np.asarray(batch["labels"], dtype=np.int64))
    rel = abs(reference - moepeak_loss) / abs(reference)
    print(f"# {'checkpoint':<40} {'moepeak loss':>14} {'reference':>14} {'rel err':>10}")
    print(f"  {os.path.basename(os.path.normpath(args.hf_dir)):<40} {moepeak_loss:14.8f} "
          f"{reference:14.8f} {rel:10.2e}")
    if not rel < LOSS_REL_TOL:
        print(f"FAIL: loss relative error {rel:.3e} >= {LOSS_REL_TOL}")
        failures += 1
    return 1 if failures else 0


def bf16(args) -> int:
    f32 = ref.load_params(args.f32)
    b16 = ref.load_params(args.bf16)
    failures = 0
    for name in sorted(f32):
        expect = ref.bf16_bits_to_float32(float32_to_bf16_bits(f32[name].astype(np.float32)))
        if not np.array_equal(expect.astype(np.float64), b16[name]):
            print(f"FAIL: {name}: the bfloat16 export is not the nearest-even rounding")
            failures += 1
    print(f"bf16 export: {len(f32) - failures} of {len(f32)} tensors are the nearest-even rounding")
    return 1 if failures else 0


def raw_tensors(path: str) -> Dict[str, tuple]:
    """Every tensor of a model directory as (safetensors dtype, shape, bytes), index or not."""
    tensors: Dict[str, tuple] = {}
    for file in ref.checkpoint_files(path):
        tensors.update(ref.read_safetensors_raw(file))
    return tensors


def mtp(args) -> int:
    """The MTP modules of HF_DIR (model.layers.{L}.* for L >= num_hidden_layers: exactly
    hf_reference.mtp_shapes' names, and their _scale_inv when FP8) are in OTHER_DIR byte for
    byte (same dtype, shape and bytes), and OTHER_DIR has no other MTP tensor."""
    cfg = ref.read_config(os.path.join(args.hf_dir, "config.json"))
    other_cfg = ref.read_config(os.path.join(args.other_dir, "config.json"))
    nextn = [getattr(c.family_fields, "num_nextn_predict_layers", 0) for c in (cfg, other_cfg)]
    a, b = raw_tensors(args.hf_dir), raw_tensors(args.other_dir)
    layer = re.compile(r"^model\.layers\.(\d+)\.")

    def mtp_names(tensors: Dict[str, tuple]):
        return sorted(n for n in tensors
                      if layer.match(n) and int(layer.match(n).group(1)) >= cfg.num_hidden_layers)

    names = mtp_names(a)
    expect = set(ref.mtp_shapes(cfg))
    expect |= {n + "_scale_inv" for n in expect if n + "_scale_inv" in a}
    problems = []
    if not names:
        problems.append(f"{args.hf_dir} holds no MTP tensors (num_nextn_predict_layers {nextn[0]})")
    elif set(names) != expect:
        problems.append(f"{args.hf_dir}: MTP tensors are not its config's: {sorted(set(names) ^ expect)[:4]}")
    if nextn[0] != nextn[1]:
        problems.append(f"num_nextn_predict_layers {nextn[0]} vs {nextn[1]} in {args.other_dir}")
    for n in names:
        if n not in b:
            problems.append(f"{n}: missing from {args.other_dir}")
        elif b[n] != a[n]:
            problems.append(f"{n}: {b[n][0]} {list(b[n][1])} in {args.other_dir} differs from "
                            f"{a[n][0]} {list(a[n][1])} (dtype, shape or bytes)")
    extra = sorted(set(mtp_names(b)) - set(names))
    if extra:
        problems.append(f"{args.other_dir} has MTP tensors {args.hf_dir} lacks: {extra[:4]}")
    for p in problems[:12]:
        print(f"FAIL: {p}")
    if len(problems) > 12:
        print(f"FAIL: ... and {len(problems) - 12} more")
    same = sum(1 for n in names if b.get(n) == a[n])
    print(f"mtp: {same} of {len(names)} MTP tensors of {args.hf_dir} identical in {args.other_dir}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--form", type=int, choices=[4, 5], required=True)
    m.add_argument("--dtype", choices=["F32", "BF16", "F16"], required=True)
    m.add_argument("--files", type=int, default=1)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--model-type", choices=["mixtral", "qwen3_moe", "gpt_oss"] + list(DEEPSEEK_TYPES),
                   default="mixtral")
    m.add_argument("--set", type=parse_set, action="append", default=[], metavar="KEY=JSON",
                   help="a config.json field, written last")
    m.add_argument("--fp8", type=int, default=0, metavar="BLOCK",
                   help="deepseek: projections as float8_e4m3fn with BLOCK x BLOCK fp32 scales")
    m.add_argument("--mtp", type=int, default=0, metavar="N", help="deepseek: N random MTP modules")
    c = sub.add_parser("check")
    c.add_argument("hf_dir")
    c.add_argument("dump_dir")
    b = sub.add_parser("bf16")
    b.add_argument("f32")
    b.add_argument("bf16")
    t = sub.add_parser("mtp")
    t.add_argument("hf_dir")
    t.add_argument("other_dir")
    args = parser.parse_args()
    if args.command == "make" and (args.fp8 < 0 or args.mtp < 0):
        parser.error("--fp8 and --mtp take positive numbers")
    return {"make": make, "check": check, "bf16": bf16, "mtp": mtp}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
