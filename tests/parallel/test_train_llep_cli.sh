#!/usr/bin/env bash
# `moepeak train --set schedules.dispatch=pipelined_llep` on 2 real rank processes (mpirun) with
# configs/tiny.toml, 3 short steps, against the same job with the standard dispatcher:
#   - exit 0; every step's loss equals the standard run's within 1e-5 relative;
#   - the metrics carry a `dispatch` peak per step, and it is below the standard run's;
#   - invalid dispatch values are rejected before any work with a message naming the key.
# Every run is under `timeout 120`: a hang is a failure (exit 124), not a blocked test.
# Run: ctest -R train_llep_cli   (or: bash tests/parallel/test_train_llep_cli.sh build/moepeak
#   "$(which mpirun)" .  with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 set as root)
set -u
bin="$1"
mpirun="$2"
src="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
train() {  # train NAME ARGS...: 2 ranks, 3 steps of a small batch
  local name="$1"; shift
  timeout -k 10 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin" train \
    --config "$src/configs/tiny.toml" --set metrics.progress=off --set job.run_dir="$tmp/runs" \
    --set job.name="$name" --set training.steps=3 --set training.batch_size=2 \
    --set training.seq_len=32 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
}
train standard --set schedules.dispatch=standard || { echo "FAIL: standard run"; cat "$tmp/standard.err"; exit 1; }
train pipelined --set schedules.dispatch=pipelined_llep --set schedules.chunk_tokens=8 \
  --set schedules.min_tokens_per_gemm=1 || { echo "FAIL: pipelined_llep run"; cat "$tmp/pipelined.err"; exit 1; }
python3 - "$tmp/runs/standard/metrics.jsonl" "$tmp/runs/pipelined/metrics.jsonl" <<'PY' || fail=1
import json, sys
std = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pip = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
bad = []
if len(std) != 3 or len(pip) != 3: bad.append("3 steps each: %d, %d" % (len(std), len(pip)))
def peak(row):  # one peak per rank or one object: the largest dispatch peak
    p = row["peak_bytes"]
    items = p if isinstance(p, list) else [p]
    return max(i["dispatch"] for i in items)
for a, b in zip(std, pip):
    if abs(a["loss"] - b["loss"]) > 1e-5 * abs(a["loss"]): bad.append("step %d loss %r vs %r" % (a["step"], b["loss"], a["loss"]))
    if not peak(b) < peak(a): bad.append("step %d dispatch peak %d not below standard %d" % (a["step"], peak(b), peak(a)))
for m in bad: print("FAIL:", m)
print("losses", [r["loss"] for r in pip], "dispatch peaks", [peak(r) for r in std], [peak(r) for r in pip])
sys.exit(1 if bad else 0)
PY
for bad in "dispatch=pipelined" "chunk_membership=diagonal" "chunk_tokens=0" "llep_lambda=0.5"; do
  timeout -k 10 60 "$bin" train --config "$src/configs/tiny.toml" --set "schedules.$bad" \
    --set job.run_dir="$tmp/runs" >"$tmp/bad.out" 2>"$tmp/bad.err"
  rc=$?
  key="schedules.${bad%%=*}"
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF "$key" "$tmp/bad.err"; then
    echo "FAIL: --set schedules.$bad: exit $rc, stderr:"; cat "$tmp/bad.err"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "PASS"
exit $fail
