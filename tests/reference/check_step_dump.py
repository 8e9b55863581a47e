#!/usr/bin/python3
"""Checks a moepeak step dump (`moepeak train --dump-step DIR`) against the float64 numpy reference
of Hugging Face transformers' MoE causal LMs (hf_reference.py: mixtral, qwen3_moe, gpt_oss,
deepseek_v3 / kimi_k2, chosen by config.json's model_type).

    /usr/bin/python3 tests/reference/check_step_dump.py DIR [--h 1e-4] [--seed 0] [--show 15]

DIR holds model.safetensors (fp32 weights before step 1), config.json, batch.safetensors
(input_ids, labels), loss.json and grads.safetensors (fp32 gradients of the step-1 loss).

Checks:
  1. the loss: reference (float64) vs loss.json, relative error < 1e-5;
  2. gradient elements: for every tensor, the element with the largest |grad| and 2 seeded random
     elements; central finite differences of the float64 reference loss vs grads.safetensors;
  3. gradient directions: for every tensor, the directional derivative of the reference loss
     along g/|g| (checks the tensor's gradient magnitude as a whole) and along a seeded random
     unit direction (touches every element at once) vs g . d.
Prints a fixed-column table of the worst errors ('#' header), then "N passed, M failed"; exits 1
when any check fails, 2 when the dump cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

# Loss bound. moepeak runs the forward in float32 (unit roundoff u = 2^-24 ~ 6e-8). The loss goes
# through dot products of length <= a few hundred, two residual layers, softmaxes and a log-sum-exp;
# rounding errors there grow roughly like sqrt(length) * u per op and partly cancel in the mean,
# so the float32 loss is expected within ~1e-7..1e-6 of the exact one. 1e-5 leaves a 10-100x
# margin for that, while any departure from HF semantics (RoPE pairing or scaling, router
# renormalisation, GQA mapping, norm eps placement, q/k norms...) moves the loss of a model
# initialised with std 0.2 by far more (1e-3 and up).
LOSS_REL_TOL = 1e-5

# Gradient bound: |g_ref - g| <= GRAD_ABS * max|g over the tensor| + GRAD_REL * |g_ref|.
# moepeak's gradients are float32 sums over B*T token contributions. Each element's error scales
# with the size of its summands (u times their magnitudes, times a modest growth factor), not with
# the element itself: an element that is small because of cancellation can carry an absolute error
# set by the tensor's typical magnitude, hence the term relative to the tensor's largest gradient;
# large elements get the relative term. Both are ~1e3 times the expected float32 error (~1e-6
# relative), yet a wrong gradient (a missing term, a wrong scale, a transposed index) is off by
# far more than 1e-3 of the tensor's scale.
GRAD_ABS = 1e-3
GRAD_REL = 1e-3

# Finite-difference step. Central differences have truncation error h^2/6 * |L'''|: with weights
# of scale ~0.2-1 and |L'''| = O(1..100), h = 1e-4 gives <= ~2e-7. Float64 rounding of the loss
# (~1e-15 relative, |L| ~ 5) contributes ~eps*|L|/h ~ 1e-11. Both are far below the bounds above.
# The loss is not smooth where the router's top-k selection changes, nor (gpt_oss) where a SwiGLU
# clamp starts or stops holding an activation; when a +-h perturbation changes any selection or
# clamp the difference is retried with h/10 and h/100, and skipped (reported) if it still crosses
# a switch.
DEFAULT_H = 1e-4


@dataclass
class Check:
    kind: str      # "loss", "elem", "dir"
    tensor: str
    where: str     # element index or direction name
    moepeak: float
    reference: float
    bound: float
    skipped: bool = False

    @property
    def err(self) -> float:
        return abs(self.reference - self.moepeak)

    @property
    def ratio(self) -> float:
        if self.skipped:
            return 0.0
        if self.bound == 0.0:
            return 0.0 if self.err == 0.0 else float("inf")
        return self.err / self.bound

    @property
    def passed(self) -> bool:
        return not self.skipped and self.err <= self.bound


def selections(result: ref.ForwardResult) -> np.ndarray:
    """All MoE layers' top-k choices as one array, each token's k experts sorted (order is
    irrelevant); empty when the model has no MoE layer."""
    if not result.selected_experts:
        return np.zeros((0, 0), dtype=np.int64)
    return np.sort(np.concatenate(result.selected_experts, axis=0), axis=-1)


def switches(result: ref.ForwardResult) -> Tuple[np.ndarray, np.ndarray]:
    """What the loss is smooth only while it stays put: the selections, and which activations
    the clamps hold (gpt_oss; empty for the other families)."""
    clamped = np.concatenate(result.clamped) if result.clamped else np.zeros(0, dtype=bool)
    return selections(result), clamped


def same_switches(a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


class Reference:
    """The float64 reference loss as a function of one perturbed tensor."""

    def __init__(self, params: Dict[str, np.ndarray], cfg: ref.ModelConfig,
                 input_ids: np.ndarray, labels: np.ndarray, sequence_aux_alpha: float = 0.0,
                 position_ids: Optional[np.ndarray] = None,
                 document_starts: Optional[np.ndarray] = None):
        self.params, self.cfg, self.input_ids, self.labels = params, cfg, input_ids, labels
        self.alpha = sequence_aux_alpha
        # packed documents (the dump's position_ids and document_starts, when it has them)
        self.packing = dict(position_ids=position_ids, document_starts=document_starts)
        self.base_loss, result = ref.loss(params, cfg, input_ids, labels, return_forward=True,
                                          sequence_aux_alpha=self.alpha, **self.packing)
        self.base_switches = switches(result)

    def _eval(self) -> Tuple[float, bool]:
        value, result = ref.loss(self.params, self.cfg, self.input_ids, self.labels, return_forward=True,
                                 sequence_aux_alpha=self.alpha, **self.packing)
        return value, same_switches(switches(result), self.base_switches)

    def directional(self, name: str, direction: np.ndarray, h: float) -> Optional[float]:
        """(L(p + h d) - L(p - h d)) / 2h for tensor `name` moved along `direction`, or None when
        every step tried crosses a change of the router's top-k selection or of a clamp."""
        tensor = self.params[name]
        saved = tensor.copy()
        try:
            for step in (h, h / 10, h / 100):
                tensor[...] = saved + step * direction
                plus, same_plus = self._eval()
                tensor[...] = saved - step * direction
                minus, same_minus = self._eval()
                tensor[...] = saved
                if same_plus and same_minus:
                    return (plus - minus) / (2 * step)
            return None
        finally:
            tensor[...] = saved


def describe(cfg: ref.ModelConfig) -> str:
    """One line naming the model's family and shape (any family)."""
    moe = len(cfg.moe_layers)
    extras = [f"rope {cfg.rope.rope_type}"]
    if cfg.tie_word_embeddings:
        extras.append("tied embeddings")
    if cfg.attention_bias:
        extras.append("attention biases")
    if cfg.attention_sinks:
        extras.append("attention sinks")
    sliding = [i for i in range(cfg.num_hidden_layers) if cfg.attention_window(i) is not None]
    if sliding:
        extras.append(f"window {cfg.sliding_window} on layers {sliding}")
    if cfg.swiglu_limit is not None:
        extras.append(f"swiglu limit {cfg.swiglu_limit:g} alpha {cfg.swiglu_alpha:g}")
    if cfg.output_router_logits:
        extras.append(f"aux loss {cfg.router_aux_loss_coef:g}")
    family = ref.FAMILIES[cfg.model_type]
    if hasattr(family, "describe"):  # deepseek_v3: MLA, grouped routing, shared experts
        extras += family.describe(cfg)
    return (f"{cfg.model_type}, {cfg.num_hidden_layers} layers ({moe} MoE), hidden {cfg.hidden_size}, "
            f"heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} (q/kv), head_dim {cfg.head_dim}, "
            f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}, vocab {cfg.vocab_size}, "
            + ", ".join(extras))


def format_index(idx: Tuple[int, ...]) -> str:
    return "(" + ",".join(str(i) for i in idx) + ")"


def sample_elements(grad: np.ndarray, rng: np.random.Generator, random_count: int) -> List[Tuple[int, ...]]:
    """The element with the largest |grad| (first one on ties), then `random_count` seeded random
    elements, without repeats."""
    chosen = [tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(grad))), grad.shape))]
    while len(chosen) < min(1 + random_count, grad.size):
        idx = tuple(int(i) for i in np.unravel_index(int(rng.integers(grad.size)), grad.shape))
        if idx not in chosen:
            chosen.append(idx)
    return chosen


def print_table(checks: List[Check], show: int) -> None:
    order = sorted(checks, key=lambda c: c.ratio, reverse=True)
    rows = order[:show] + [c for c in order[show:] if not c.passed and not c.skipped]
    print(f"# worst {len(rows)} of {len(checks)} checks by err/bound "
          f"(bound: loss {LOSS_REL_TOL:g}*|ref|; gradients {GRAD_ABS:g}*max|g|+{GRAD_REL:g}*|ref|)")
    print(f"# {'kind':<4} {'tensor':<52} {'where':<12} {'moepeak':>14} {'reference':>14} "
          f"{'abs_err':>10} {'bound':>10} {'err/bound':>9}  status")
    for c in rows:
        status = "SKIP" if c.skipped else ("ok" if c.passed else "FAIL")
        print(f"  {c.kind:<4} {c.tensor:<52} {c.where:<12} {c.moepeak:>14.7e} {c.reference:>14.7e} "
              f"{c.err:>10.3e} {c.bound:>10.3e} {c.ratio:>9.3f}  {status}")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dump", help="the --dump-step directory")
    parser.add_argument("--h", type=float, default=DEFAULT_H, help="finite-difference step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled elements/directions")
    parser.add_argument("--random", type=int, default=2, help="random elements per tensor")
    parser.add_argument("--show", type=int, default=15, help="rows of the table (failures always shown)")
    args = parser.parse_args(argv)

    d = args.dump
    try:
        cfg = ref.read_config(os.path.join(d, "config.json"))
        # moepeak writes DeepSeek's own "seq_aux" and "aux_loss_alpha" when its sequence-wise
        # balance loss is on (transformers, and so read_config, ignore them).
        with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
            raw = json.load(f)
        alpha = float(raw.get("aux_loss_alpha") or 0.0) if raw.get("seq_aux") is True else 0.0
        params = ref.load_params(os.path.join(d, "model.safetensors"))
        grads = {k: np.array(v, dtype=np.float64) for k, v in
                 ref.read_safetensors(os.path.join(d, "grads.safetensors")).items()}
        batch = ref.read_safetensors(os.path.join(d, "batch.safetensors"))
        with open(os.path.join(d, "loss.json"), encoding="utf-8") as f:
            dumped_loss = float(json.load(f)["loss"])
    except (OSError, ValueError, KeyError) as e:
        print(f"check_step_dump: cannot read the dump in {d}: {e}", file=sys.stderr)
        return 2
    input_ids = np.asarray(batch["input_ids"], dtype=np.int64)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    position_ids = np.asarray(batch["position_ids"], dtype=np.int64) if "position_ids" in batch else None
    document_starts = (np.asarray(batch["document_starts"], dtype=np.int64)
                       if "document_starts" in batch else None)

    print(f"# dump {d}: {describe(cfg)}{f', sequence-wise balance loss {alpha:g}' if alpha else ''}; batch {input_ids.shape[0]}x{input_ids.shape[1]}, "
          f"{int(np.sum(labels != ref.IGNORE_INDEX))} labelled"
          + (f", {int(np.sum(document_starts == np.arange(input_ids.shape[1])))} documents"
             if document_starts is not None else "")
          + (", positions restarting" if position_ids is not None and
             np.any(position_ids != np.arange(input_ids.shape[1])) else ""))

    problems = []
    # deepseek_v3's MTP modules: the loss does not read them, so neither their weights nor any
    # gradients dumped for them are checked here (hf_roundtrip.py mtp compares exports' bytes).
    mtp = set(ref.mtp_shapes(cfg)) & (set(params) | set(grads))
    if mtp:
        print(f"# {len(mtp)} MTP tensors in the dump: not checked (the reference's loss does not read them)")
        if not set(ref.mtp_shapes(cfg)) <= set(params):
            problems.append("the dump holds some of the MTP tensors but not all")
        params = {n: t for n, t in params.items() if n not in mtp}
        grads = {n: t for n, t in grads.items() if n not in mtp}
    try:
        ref.check_params(params, cfg)  # the tensor names and shapes the config implies
    except ValueError as e:
        problems.append(str(e))
    if set(params) != set(grads):
        problems.append(f"model/grads tensor names differ: {sorted(set(params) ^ set(grads))}")
    for name in sorted(set(params) & set(grads)):
        if params[name].shape != grads[name].shape:
            problems.append(f"{name}: weight shape {params[name].shape} vs grad {grads[name].shape}")
    if problems:
        for p in problems:
            print(f"check_step_dump: {p}", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1

    reference = Reference(params, cfg, input_ids, labels, alpha, position_ids, document_starts)
    checks: List[Check] = []
    rel = abs(reference.base_loss - dumped_loss) / abs(reference.base_loss)
    print(f"# loss: moepeak {dumped_loss:.10f}, reference {reference.base_loss:.10f}, "
          f"relative error {rel:.3e} (bound {LOSS_REL_TOL:g})")
    checks.append(Check("loss", "loss", "-", dumped_loss, reference.base_loss,
                        LOSS_REL_TOL * abs(reference.base_loss)))

    rng = np.random.default_rng(args.seed)
    for name in sorted(params):
        g = grads[name]
        scale = float(np.max(np.abs(g)))
        for idx in sample_elements(g, rng, args.random):
            e = np.zeros_like(g)
            e[idx] = 1.0
            fd = reference.directional(name, e, args.h)
            bound = GRAD_ABS * scale + GRAD_REL * abs(fd if fd is not None else 0.0)
            checks.append(Check("elem", name, format_index(idx), float(g[idx]),
                                fd if fd is not None else float("nan"), bound, skipped=fd is None))
        norm = float(np.linalg.norm(g))
        random_dir = rng.standard_normal(g.shape)
        random_dir /= np.linalg.norm(random_dir)
        directions = [("dir:rand", random_dir)]
        if norm > 0:
            directions.insert(0, ("dir:grad", g / norm))
        for label, direction in directions:
            fd = reference.directional(name, direction, args.h)
            # |e . d| <= |e| for the unit direction d: the same per-tensor scale, via the 2-norm.
            bound = GRAD_ABS * norm + GRAD_REL * abs(fd if fd is not None else 0.0)
            checks.append(Check("dir", name, label, float(np.sum(g * direction)),
                                fd if fd is not None else float("nan"), bound, skipped=fd is None))

    print_table(checks, args.show)
    grad_checks = [c for c in checks if c.kind != "loss" and not c.skipped]
    if grad_checks:
        worst = max(grad_checks, key=lambda c: c.ratio)
        print(f"# worst gradient error: {worst.tensor} {worst.where}: abs {worst.err:.3e} "
              f"(moepeak {worst.moepeak:.6e}, reference {worst.reference:.6e}), {worst.ratio:.4f} of its bound")
    skipped = sum(c.skipped for c in checks)
    if skipped:
        print(f"# {skipped} skipped: the router's top-k choice or a clamp changes within +-h/100")
    passed = sum(c.passed for c in checks)
    failed = len(checks) - passed - skipped
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
