#!/usr/bin/env bash
# test_hf_reference: moepeak's step-1 loss and gradients against an independent float64 numpy
# reference of Hugging Face's MixtralForCausalLM (mixtral_reference.py, check_step_dump.py).
#   bash run_reference_check.sh path/to/moepeak
# Each case trains one step of a small model with --dump-step and checks the dump. Needs Debian's
# /usr/bin/python3 with python3-numpy (a PATH python3 may lack numpy).
set -euo pipefail

moepeak=${1:?usage: run_reference_check.sh path/to/moepeak}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=/usr/bin/python3

if ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "run_reference_check: $python cannot import numpy (install the Debian package python3-numpy)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moepeak_hf_ref.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Common to every case: one step of a small model, weights with std 0.2 so that every part of
# the model (attention pattern, router choices, norms) visibly shapes the loss.
common=(--set training.steps=1 --set training.seq_len=16 --set training.batch_size=2
        --set model.vocab_size=64 --set model.initializer_range=0.2 --set metrics.progress=off)

failures=0
run_case() {
  local name=$1; shift
  echo "=== case $name: $*"
  if ! "$moepeak" train "${common[@]}" --set job.run_dir="$tmp/runs_$name" "$@" \
       --dump-step "$tmp/dump_$name" >"$tmp/train_$name.log" 2>&1; then
    echo "moepeak train failed for case $name:" >&2
    cat "$tmp/train_$name.log" >&2
    failures=$((failures + 1))
    return
  fi
  if ! "$python" "$here/check_step_dump.py" "$tmp/dump_$name"; then
    failures=$((failures + 1))
  fi
}

# The embedded default model (2 layers, 4 heads / 2 kv heads, 4 experts top-2), reduced vocabulary.
run_case gqa2
# Every query head on one kv head, and no activation checkpointing (a different backward path).
run_case mqa_nockpt --set model.num_key_value_heads=1 --set schedules.checkpoint=none
# Other shapes: full multi-head attention, head_dim != hidden/heads, 5 experts top-3, 3 layers,
# a large norm eps and a small rope theta (so their placement matters), longer sequences.
run_case mha_shapes --set model.num_key_value_heads=4 --set model.head_dim=8 \
  --set model.num_local_experts=5 --set model.num_experts_per_tok=3 --set model.num_hidden_layers=3 \
  --set model.rms_norm_eps=0.01 --set model.rope_theta=100 --set training.seq_len=24
# Mixtral's auxiliary load-balancing loss (config.json then says output_router_logits = true).
run_case aux_loss --set model.router_aux_loss_coef=0.2

if ((failures)); then
  echo "test_hf_reference: $failures case(s) failed" >&2
  exit 1
fi
echo "test_hf_reference: all cases passed"
