#!/usr/bin/env bash
# scripts/gpu_reference.sh: the small preset's training run that scripts/gpu-check.sh compares
# the GPU against the CPU with, and the CPU's losses it compares to.
#
#   scripts/gpu_reference.sh run BACKEND DTYPE STEPS RUN_DIR
#       one run of configs/small.toml with every bounded operator on (PipelinedLLEP, Ring-DTP,
#       SCO, OffloadStreamAdamW), one rank, no checkpoint, BACKEND cpu|cuda, DTYPE
#       float32|bfloat16; its metrics in RUN_DIR/small-BACKEND-DTYPE/metrics.jsonl
#   scripts/gpu_reference.sh write FILE      the CPU's first 3 losses in both dtypes, as JSON
#   scripts/gpu_reference.sh check FILE      the same, compared with FILE: exit 1 when a loss
#                                            moved past a tenth of gpu-check's tolerance for the
#                                            GPU (1e-7 relative in float32, 2e-4 in bfloat16):
#                                            the code changed the losses, write FILE again.
#                                            (Another order of summation — the GPU's cuBLAS, or
#                                            another CPU's OpenBLAS kernels — moved the f32 losses
#                                            of steps 1-3 by 2.4e-8 at most on the H200.)
#
# The binary is $MOEPEAK_BUILD_DIR/moepeak (default build/). FILE is kept in the repository
# (scripts/gpu_reference_losses.json): a GPU machine's CPU cores are no reference to wait for
# (the small preset on 16 OpenBLAS threads of an H200 node took 13 s a step, on this 2-core VM
# 6.5 s), so gpu-check reads the losses instead of running the CPU. CI runs `check`
# (tests/cli/test_gpu_reference.sh).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${MOEPEAK_BUILD_DIR:-$root/build}/moepeak"
steps_in_file=3

run() {  # run BACKEND DTYPE STEPS RUN_DIR
  "$bin" train -c "$root/configs/small.toml" --set runtime.backend="$1" \
    --set training.dtype="$2" --set training.steps="$3" --set metrics.progress=off \
    --set schedules.dispatch=pipelined_llep --set schedules.vocab=ring_dtp \
    --set schedules.checkpoint=sco --set optimizer.placement=offload_stream \
    --set checkpoint.enable=false --set job.run_dir="$4" --set job.name="small-$1-$2"
}

# losses RUN_DIR: {"float32": [...], "bfloat16": [...]} from the CPU runs in RUN_DIR.
losses() {
  python3 - "$1" <<'EOF'
import json, sys
out = {}
for dtype in ("float32", "bfloat16"):
    with open(f"{sys.argv[1]}/small-cpu-{dtype}/metrics.jsonl") as f:
        out[dtype] = [json.loads(line)["loss"] for line in f if line.strip()]
print(json.dumps(out, indent=2))
EOF
}

case "${1:-}" in
  run)
    [ $# -eq 5 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
    run "$2" "$3" "$4" "$5"
    ;;
  write|check)
    [ $# -eq 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    for dtype in float32 bfloat16; do
      run cpu "$dtype" "$steps_in_file" "$tmp" >"$tmp/$dtype.log" 2>&1 ||
        { cat "$tmp/$dtype.log" >&2; exit 1; }
    done
    if [ "$1" = write ]; then
      losses "$tmp" >"$2"
      echo "gpu_reference: wrote $2"
    else
      losses "$tmp" >"$tmp/now.json"
      python3 - "$2" "$tmp/now.json" <<'EOF'
import json, sys
kept, now = (json.load(open(p)) for p in sys.argv[1:3])
tolerance = {"float32": 1e-7, "bfloat16": 2e-4}  # a tenth of scripts/gpu_targets.py's
bad = [(d, i + 1, k, n) for d in ("float32", "bfloat16")
       for i, (k, n) in enumerate(zip(kept[d], now[d])) if abs(k - n) > tolerance[d] * abs(n)]
if bad or any(len(kept[d]) != len(now[d]) for d in now):
    for d, step, k, n in bad:
        print(f"gpu_reference: {d} step {step}: {sys.argv[1]} has {k!r}, the CPU now gives {n!r}")
    print(f"gpu_reference: {sys.argv[1]} is stale: run scripts/gpu_reference.sh write {sys.argv[1]}")
    sys.exit(1)
print(f"gpu_reference: {sys.argv[1]} matches the CPU ({', '.join(f'{d} {now[d]}' for d in now)})")
EOF
    fi
    ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
