#!/usr/bin/env bash
# `srun ... moepeak train` on a private single-node Slurm that this test starts and stops itself
# (tests/slurm/local_slurm.sh): 2 and 4 ranks under `srun --mpi=pmix -O` exit 0, log with the
# "[rank 0/W]" prefix, write 5 metrics lines with world_size W, and every step's loss and
# grad_norm agree within 1e-5 (relative) with a plain 1-rank run of the same config; `srun
# --mpi=none` fails (non-zero, no hang, no run directory) with a message that says to use
# `srun --mpi=pmix`.
# Needs root (the daemons run as root): otherwise prints SKIP and exits 77. As root, missing
# Slurm/munge binaries or daemons that do not start are a FAIL (scripts/test.sh installs them).
# Run: ctest -R test_srun_train   (or, as root: bash tests/slurm/test_srun_train.sh build/moepeak .)
set -u
bin="$1"
src="$2"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: test_srun_train needs root (its private Slurm runs slurmctld/slurmd as root)"
  exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/slurm_test_setup.sh
source "$here/slurm_test_setup.sh"  # $tmp, check, report; stops the cluster on exit
# Prints the last lines of a failed command's stderr, so a FAIL says why.
show() { echo "----- last lines of $1 -----"; tail -n 25 "$1"; }

# Every command gets at most 120 s, and all of them together finish well inside CTest's 300 s,
# so the EXIT trap always gets to stop the daemons.
deadline=$((SECONDS + 250))
timed() {
  local t=$((deadline - SECONDS))
  [ $t -gt 120 ] && t=120
  [ $t -lt 5 ] && t=5
  timeout -k 10 "$t" "$@"
}

# jsonl CHECK FILE ARG: steps FILE N | world FILE W | match FILE REFERENCE-FILE
jsonl() {
  /usr/bin/python3 - "$@" <<'EOF'
import json, sys
what, path, arg = sys.argv[1], sys.argv[2], sys.argv[3]
def fail(message):
    print(message)
    sys.exit(1)
def load(p):
    with open(p) as f:
        return [json.loads(line) for line in f if line.strip()]
try:
    rows = load(path)
except (OSError, ValueError) as e:
    fail(f"{path}: {e}")
if what == "steps":
    steps = [r.get("step") for r in rows]
    if len(rows) != int(arg):
        fail(f"{path}: {len(rows)} lines, want {arg} (steps {steps})")
elif what == "world":
    bad = [(r.get("step"), r.get("world_size")) for r in rows if r.get("world_size") != int(arg)]
    if bad or not rows:
        fail(f"{path}: (step, world_size) not {arg}: {bad or 'no lines'}")
elif what == "match":
    ref = load(arg)
    if len(ref) != len(rows) or not rows:
        fail(f"{len(rows)} lines in {path} but {len(ref)} in {arg}")
    errors = []
    for r, g in zip(ref, rows):
        if r.get("step") != g.get("step"):
            errors.append(f"step {g.get('step')} where the 1-rank run has step {r.get('step')}")
            continue
        for key in ("loss", "grad_norm"):
            a, b = r.get(key), g.get(key)
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
                errors.append(f"step {r['step']} {key}: {b!r} vs 1-rank {a!r}")
            elif abs(a - b) > 1e-5 * max(abs(a), abs(b), 1e-30):
                errors.append(f"step {r['step']} {key}: {b!r} vs 1-rank {a!r} "
                              f"(rel {abs(a - b) / max(abs(a), abs(b)):.2e})")
    if errors:
        fail("\n".join(errors))
else:
    fail(f"jsonl: unknown check {what}")
EOF
}

train_args=(train --config "$src/configs/tiny.toml" --set training.steps=5
            --set metrics.progress=off --set job.run_dir="$tmp/runs")

if ! local_slurm_start "$tmp/slurm"; then
  echo "FAIL: the private Slurm did not start (see the errors and log tails above)"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "private Slurm under $tmp/slurm: $(grep -E '^Slurm(ctld|d)Port=' "$SLURM_CONF" | tr '\n' ' ')"

# The reference: the same config as a plain process (no launcher, no MPI).
timed "$bin" "${train_args[@]}" --set job.name=plain1 >"$tmp/plain1.out" 2>"$tmp/plain1.err"; rc=$?
check "plain 1-rank train exits 0 (rc $rc)" test $rc -eq 0 || show "$tmp/plain1.err"
check "plain 1-rank train writes 5 metrics lines" jsonl steps "$tmp/runs/plain1/metrics.jsonl" 5
check "plain 1-rank train has world_size 1" jsonl world "$tmp/runs/plain1/metrics.jsonl" 1

for n in 2 4; do
  name="srun$n"
  timed srun --mpi=pmix -O -n "$n" "$bin" "${train_args[@]}" --set job.name="$name" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"; rc=$?
  check "srun --mpi=pmix -n $n train exits 0 (rc $rc)" test $rc -eq 0 || show "$tmp/$name.err"
  check "srun -n $n: the log shows [rank 0/$n]" contains "$tmp/$name.err" "[rank 0/$n]"
  check "srun -n $n: 5 metrics lines" jsonl steps "$tmp/runs/$name/metrics.jsonl" 5
  check "srun -n $n: world_size $n in every line" jsonl world "$tmp/runs/$name/metrics.jsonl" "$n"
  check "srun -n $n: loss and grad_norm match the 1-rank run within 1e-5" \
    jsonl match "$tmp/runs/$name/metrics.jsonl" "$tmp/runs/plain1/metrics.jsonl"
done

# Without a process-management interface MPI cannot connect the ranks: a clear error, not a hang
# or an abort inside MPI_Init.
timed srun --mpi=none -O -n 2 "$bin" "${train_args[@]}" --set job.name=nompi \
  >"$tmp/nompi.out" 2>"$tmp/nompi.err"; rc=$?
check "srun --mpi=none exits non-zero (rc $rc)" test $rc -ne 0
check "srun --mpi=none does not hang" test $rc -ne 124 -a $rc -ne 137
check "srun --mpi=none says to use srun --mpi=pmix" contains "$tmp/nompi.err" "srun --mpi=pmix" \
  || show "$tmp/nompi.err"
check "srun --mpi=none leaves no run directory" test ! -e "$tmp/runs/nompi"

# The cluster is still healthy after all that (no node drained by a failed step); a node that
# is still "completing" the last job gets 15 s.
node_idle() {
  local until=$((SECONDS + 15))
  while :; do
    state=$(timed sinfo -h -n localhost -o %T 2>&1)
    [ "$state" = idle ] && return 0
    [ $SECONDS -ge $until ] && { echo "sinfo says: $state"; return 1; }
    sleep 0.2
  done
}
check "the node is idle at the end" node_idle

report
