#!/usr/bin/python3
"""Hugging Face checkpoints in and out of moepeak, against the float64 numpy reference of
MixtralForCausalLM (mixtral_reference.py). Used by run_hf_roundtrip.sh.

    hf_roundtrip.py make DIR --form 4|5 --dtype F32|BF16|F16 --files N [--seed S]
        Writes a Hugging Face Mixtral directory of random weights (std 0.2): config.json in the
        transformers 4 form (rope_theta, torch_dtype, head_dim spelled out) or the 5 form
        (rope_parameters.rope_theta, dtype, "head_dim": null), the weights in one
        model.safetensors (N = 1) or N files with model.safetensors.index.json.
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
import mixtral_reference as ref  # noqa: E402

LOSS_REL_TOL = 1e-5  # as check_step_dump.py: float32 forward vs float64 reference

# The model of the hand-made checkpoints: every feature the loss depends on visibly (GQA 4/2,
# 4 experts top-2, 2 layers), with head_dim derived from hidden / heads so that the transformers 5
# form's "head_dim": null is exercised.
SHAPE = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
             num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-5)
ROPE_THETA = 5000.0


def param_shapes(c: Dict) -> Dict[str, tuple]:
    """MixtralForCausalLM's tensor names and shapes."""
    h, f, e = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    d = h // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (c["num_attention_heads"] * d, h)
        shapes[p + "self_attn.k_proj.weight"] = (c["num_key_value_heads"] * d, h)
        shapes[p + "self_attn.v_proj.weight"] = (c["num_key_value_heads"] * d, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, c["num_attention_heads"] * d)
        shapes[p + "block_sparse_moe.gate.weight"] = (e, h)
        for j in range(e):
            q = p + f"block_sparse_moe.experts.{j}."
            shapes[q + "w1.weight"] = (f, h)
            shapes[q + "w3.weight"] = (f, h)
            shapes[q + "w2.weight"] = (h, f)
    return shapes


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
    os.makedirs(args.dir, exist_ok=True)
    config = dict(SHAPE, architectures=["MixtralForCausalLM"], model_type="mixtral",
                  hidden_act="silu", tie_word_embeddings=False, sliding_window=None,
                  router_aux_loss_coef=0.02, output_router_logits=False, initializer_range=0.02)
    torch_dtype = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[args.dtype]
    if args.form == 4:
        config.update(rope_theta=ROPE_THETA, torch_dtype=torch_dtype,
                      head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                      transformers_version="4.46.0")
    else:
        config.update(rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                      dtype=torch_dtype, head_dim=None, transformers_version="5.0.0")
    with open(os.path.join(args.dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)

    rng = np.random.default_rng(args.seed)
    files = [dict() for _ in range(args.files)]
    for k, (name, shape) in enumerate(param_shapes(config).items()):
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
