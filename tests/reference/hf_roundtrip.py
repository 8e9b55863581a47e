#!/usr/bin/python3
"""Hugging Face checkpoints in and out of moepeak, against the float64 numpy reference of
transformers' MoE causal LMs (hf_reference.py: mixtral, qwen3_moe, gpt_oss). Used by
run_hf_roundtrip.sh.

    hf_roundtrip.py make DIR --form 4|5 --dtype F32|BF16|F16 --files N [--seed S]
                    [--model-type mixtral|qwen3_moe|gpt_oss] [--set KEY=JSON ...]
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
    hf_roundtrip.py check HF_DIR DUMP_DIR
        HF_DIR is what moepeak started from (a directory made above, or a `moepeak export`);
        DUMP_DIR its step-1 dump (`train --init-from HF_DIR --dump-step DUMP_DIR`). Checks that
        (1) the dump's weights are HF_DIR's, converted to float32 exactly (BF16 and F16 widen
        without rounding), and (2) the float64 reference loss of HF_DIR's weights on the dump's
        batch equals the dump's loss within LOSS_REL_TOL (check_step_dump.py's bound and reasons).
    hf_roundtrip.py bf16 EXPORT_F32 EXPORT_BF16
        Every weight of EXPORT_BF16 is the round-to-nearest-even bfloat16 of EXPORT_F32's.
Exits 0 when every check passes, 1 otherwise (printing what differs).
"""

from __future__ import annotations

import argparse
import json
import os
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


def make(args) -> int:
    config = make_config(args.model_type, args.form, args.dtype)
    for key, value in args.set:
        config[key] = value
    if args.model_type == "gpt_oss" and "layer_types" not in dict(args.set):
        config["layer_types"] = gpt_oss_layer_types(int(config["num_hidden_layers"]))
    shapes = ref.param_shapes(ref.config_from_dict(config, where="the config to write"))
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)

    rng = np.random.default_rng(args.seed)
    files = [dict() for _ in range(args.files)]
    for k, (name, shape) in enumerate(shapes.items()):
        x = rng.normal(0.0, 0.2, size=shape).astype(np.float32)
        if name.endswith("norm.weight"):
            x = (1.0 + x).astype(np.float32)
        if args.dtype == "F32":
            raw = x.tobytes()
        elif args.dtype == "F16":
            raw = x.astype(np.float16).tobytes()
        else:
            raw = float32_to_bf16_bits(x).tobytes()
        files[k % args.files][name] = (args.dtype, shape, raw)
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
    hf = ref.load_params(args.hf_dir)
    dumped = ref.load_params(os.path.join(args.dump_dir, "model.safetensors"))
    if set(hf) != set(dumped):
        print(f"FAIL: tensor names differ: {sorted(set(hf) ^ set(dumped))[:5]}")
        return 1
    for name in sorted(hf):
        # Both sides are float32-representable values; the dump is what moepeak loaded.
        if not np.array_equal(hf[name].astype(np.float32), dumped[name].astype(np.float32)):
            diff = np.max(np.abs(hf[name] - dumped[name]))
            print(f"FAIL: {name}: the dump's weights differ from {args.hf_dir}'s (max {diff:.3e})")
            failures += 1
    cfg = ref.read_config(os.path.join(args.hf_dir, "config.json"))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--form", type=int, choices=[4, 5], required=True)
    m.add_argument("--dtype", choices=["F32", "BF16", "F16"], required=True)
    m.add_argument("--files", type=int, default=1)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--model-type", choices=["mixtral", "qwen3_moe", "gpt_oss"], default="mixtral")
    m.add_argument("--set", type=parse_set, action="append", default=[], metavar="KEY=JSON",
                   help="a config.json field, written last")
    c = sub.add_parser("check")
    c.add_argument("hf_dir")
    c.add_argument("dump_dir")
    b = sub.add_parser("bf16")
    b.add_argument("f32")
    b.add_argument("bf16")
    args = parser.parse_args()
    return {"make": make, "check": check, "bf16": bf16}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
