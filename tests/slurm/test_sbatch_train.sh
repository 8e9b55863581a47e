#!/usr/bin/env bash
# slurm/train.sbatch on a private single-node Slurm that this test starts and stops itself
# (tests/slurm/local_slurm.sh: munged, slurmctld and slurmd from Debian's packages, configuration
# in a temporary directory, daemons stopped by PID):
#   1. `sbatch slurm/train.sbatch configs/tiny.toml` on 2 tasks runs to COMPLETED with exit 0,
#      writes its log as <job-name>_<job-id>.out and its run directory as runs/<name>_<id>, and
#      the loss log (metrics.jsonl) has every step, world_size 2, with the losses of a plain
#      1-rank run (1e-5 relative); srun here cannot bind, so the ranks bind themselves;
#   2. the same job signalled with USR1 mid-training (`scancel --signal=USR1 --batch`: what
#      `--signal=B:USR1@120` does before the time limit) checkpoints at a step boundary, exits 75,
#      requeues itself (Restarts=1), resumes from that checkpoint in the same run directory and
#      finishes with the same final loss as the uninterrupted run 1 — bitwise, and every step's
#      loss once, in order, equal to run 1's;
#   3. the template refuses to start without a config (usage, exit 2).
# Slurm holds a requeued job back for about two minutes (EligibleTime); the test releases it
# with `scontrol update StartTime=now` once the node is idle again, instead of waiting.
# Needs root (SKIP, exit 77, otherwise). Run: ctest -R test_sbatch_train
#   (or, as root: bash tests/slurm/test_sbatch_train.sh build/moepeak .)
set -u
bin="$1"
src="$2"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: test_sbatch_train needs root (its private Slurm runs slurmctld/slurmd as root)"
  exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
src=$(cd "$src" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/slurm_test_setup.sh
source "$here/slurm_test_setup.sh"  # $tmp, check, report; stops the cluster on exit
contains() { grep -qF -- "$2" "$1" || { echo "no '$2' in $1:"; tail -n 30 "$1"; return 1; }; }
deadline=$((SECONDS + 400))  # every wait below ends by then, inside CTest's timeout
# shellcheck source=tests/slurm/slurm_jobs.sh
source "$here/slurm_jobs.sh"  # job_field, wait_state, requeued, completed

steps=40
config="$src/configs/tiny.toml"
common=(--set training.steps=$steps --set metrics.progress=off --set checkpoint.interval=0)

if ! local_slurm_start "$tmp/slurm"; then
  echo "FAIL: the private Slurm did not start (see the errors and log tails above)"
  echo "0 passed, 1 failed"
  exit 1
fi
mkdir -p "$tmp/work"
cd "$tmp/work" || exit 1
export MOEPEAK="$bin" MOEPEAK_RUN_ROOT="$tmp/work/runs"
# The template asks for 8 GPUs and 16 cores per rank; this node has no GPU and few cores.
submit=(sbatch --parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1)
if [ "$(nproc)" -lt 2 ]; then export MOEPEAK_SRUN_ARGS="-O"; submit+=(-O); fi

# The reference: the same config as a plain process.
timeout 120 "$bin" train --config "$config" "${common[@]}" --set job.run_dir="$tmp/plain" \
  --set job.name=plain >"$tmp/plain.out" 2>&1
check "plain 1-rank train exits 0" test $? -eq 0 || tail -n 20 "$tmp/plain.out"

# 1. A run to the end.
job=$("${submit[@]}" --job-name=full "$src/slurm/train.sbatch" "$config" "${common[@]}")
check "sbatch train.sbatch gives a job id ($job)" test -n "$job"
check "the run is COMPLETED with exit 0:0" completed "$job"
log="$tmp/work/full_$job.out"
check "the job log is <job-name>_<job-id>.out" test -s "$log"
check "the job log names the run directory" contains "$log" "run directory $tmp/work/runs/full_$job"
check "srun started 2 ranks" contains "$log" "[rank 0/2]"
# This Slurm's task/none plugin cannot bind (srun says so), so runtime.bind = "auto" binds each
# rank itself to its share of the PUs (local rank 0 -> PU 0).
if [ "$(nproc)" -ge 2 ]; then
  check "the ranks bound themselves (local rank 0 on PU 0)" contains "$log" "rank 0 bound to PUs 0 ("
fi
full="$tmp/work/runs/full_$job/metrics.jsonl"
check "the loss log has steps 1..$steps, world_size 2, the plain run's losses (1e-5)" \
  /usr/bin/python3 - "$full" "$tmp/plain/plain/metrics.jsonl" "$steps" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ref = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
n = int(sys.argv[3])
assert [r["step"] for r in rows] == list(range(1, n + 1)), [r["step"] for r in rows]
assert all(r["world_size"] == 2 for r in rows)
for r, p in zip(rows, ref):
    assert abs(r["loss"] - p["loss"]) <= 1e-5 * abs(p["loss"]), (r["step"], r["loss"], p["loss"])
EOF

# 2. The same run signalled mid-training: checkpoint, exit 75, requeue, resume.
job2=$("${submit[@]}" --job-name=pre "$src/slurm/train.sbatch" "$config" "${common[@]}")
pre="$tmp/work/runs/pre_$job2/metrics.jsonl"
log2="$tmp/work/pre_$job2.out"
started() {  # two steps done and the run still going
  while [ $SECONDS -lt $deadline ]; do
    if [ -f "$pre" ] && [ "$(wc -l <"$pre")" -ge 2 ]; then return 0; fi
    sleep 0.05
  done
  return 1
}
check "the second run gets to step 2" started
scancel --signal=USR1 --batch "$job2"
# Requeued: back to PENDING with Restarts=1 (Slurm holds it ~2 minutes: release it now).
check "USR1 makes the job requeue itself" requeued "$job2" 1
# Release it once the node has cleaned up after run 0 (idle, no step daemon of this cluster left):
# the ~2 minutes Slurm would wait exist for that, and a step started while run 0's slurmstepd is
# still exiting fails to launch.
node_clean() {
  while [ $SECONDS -lt $deadline ]; do
    [ "$(sinfo -h -n localhost -o %T)" = idle ] && [ -z "$(_local_slurm_stepds)" ] && return 0
    sleep 0.2
  done
  echo "node $(sinfo -h -n localhost -o %T), step daemons: $(_local_slurm_stepds | tr '\n' ' ')"
  return 1
}
check "the node is clean after run 0" node_clean
scontrol update jobid="$job2" StartTime=now
check "the requeued run is COMPLETED with exit 0:0 after 1 restart" completed "$job2" 1
check "the ranks stopped on the signal with a checkpoint" contains "$log2" "preempted (signal 10) after step"
check "the script requeued the job" contains "$log2" "requeueing job $job2"
check "the job log kept both runs (run 0 and run 1)" contains "$log2" "job $job2 run 1 on"
check "the second run resumed from the checkpoint" contains "$log2" "resumed from $tmp/work/runs/pre_$job2/"
check "every step once, in order, and the final loss equals the uninterrupted run's (bitwise)" \
  /usr/bin/python3 - "$pre" "$full" "$steps" "$log2" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
full = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
n = int(sys.argv[3])
stop = int(re.search(r"preempted \(signal 10\) after step (\d+)", open(sys.argv[4]).read()).group(1))
assert 2 <= stop < n, f"stopped after step {stop} of {n}: not mid-training"
assert [r["step"] for r in rows] == list(range(1, n + 1)), [r["step"] for r in rows]
for r, f in zip(rows, full):
    assert r["loss"] == f["loss"], (r["step"], r["loss"], f["loss"])
print(f"stopped after step {stop}, resumed, final loss {rows[-1]['loss']!r}")
EOF

# 3. Usage errors are the template's, before srun.
"$src/slurm/train.sbatch" >"$tmp/usage.out" 2>&1
check "train.sbatch without a config exits 2" test $? -eq 2
check "train.sbatch without a config prints its usage" contains "$tmp/usage.out" "usage: sbatch"

report
