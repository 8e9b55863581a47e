#!/usr/bin/env python3
"""The peer of `moepeak bench step -c configs/small.toml`: Hugging Face transformers' Mixtral at
the small preset's shape (docs/perf.md, "The CPU step against transformers").

One training step = forward, cross-entropy over every next token, backward, AdamW (torch.optim,
its defaults but moepeak's lr, betas, eps and weight decay), float32, the library's default
attention and experts, on `--threads` threads. Prints the median step time and tokens/s over
`--iters` steps after `--warmup`, and with --json writes {"step_s", "tokens_per_s", ...}.

Not part of the build or CI: it needs torch and transformers from PyPI in a venv of your own
(python3 -m venv peer && peer/bin/pip install torch transformers). Run it through
scripts/bench_peer_step.sh, which alternates it with moepeak on the same shape.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    # configs/small.toml
    cfg = MixtralConfig(vocab_size=4096, hidden_size=512, intermediate_size=1024,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=64, num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False)
    model = MixtralForCausalLM(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g)
    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
    step = statistics.median(times)
    tokens = a.batch * a.seq
    row = {"peer": f"transformers {transformers.__version__} (torch {torch.__version__})",
           "attention": model.config._attn_implementation, "threads": a.threads,
           "step_s": step, "tokens_per_s": tokens / step, "times": times,
           "loss": float(out.loss)}
    print(f"# {row['peer']}, attention {row['attention']}, {a.threads} threads, "
          f"batch {a.batch} x {a.seq}: median {step:.4f} s, {tokens / step:.0f} tokens/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f)


if __name__ == "__main__":
    main()
