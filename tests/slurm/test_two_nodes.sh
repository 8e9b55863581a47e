#!/usr/bin/env bash
# moepeak on a real two-node Slurm that this test starts and stops itself
# (tests/slurm/two_node_slurm.sh: nodes n1 and n2, each a network namespace with its own host
# name and slurmd, on a bridge; slurmctld on n1; MPI between the nodes over TCP, PMIx through
# `srun --mpi=pmix`), with the templates of slurm/ unchanged but for the CPU-node overrides their
# headers document:
#   1. `sbatch -N 2 slurm/probe.sbatch` writes one probe file per host (probe-n1, probe-n2);
#   2. `sbatch -N 2 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.toml` with all four
#      bounded schedules and MOEPEAK_PROBE_FILE=.../probe-{host}.toml: COMPLETED, every step's
#      loss within 1e-5 of a 1-rank run, and each rank's log line names its node, its local rank,
#      its binding and the probe file of its own host;
#   3. the same with parallelism.data_shard = 2 (a ZeRO-3 group per node, replicas across);
#   4. a probe file missing for n2: the job fails, and the error names host n2;
#   5. USR1 to the two-node job: checkpoint, exit 75, requeue, resume bit for bit;
#   6. node n2 dies mid-run (SIGKILL to every process on it: slurmd, step daemon, ranks): nothing
#      of the job runs on n1 either within 60 s (the collective watchdog, runtime.collective_timeout
#      = 10 s, or MPI's own error ends the ranks there); with n2 back (a fresh slurmd), the job,
#      requeued by Slurm, resumes from the last checkpoint on a fresh allocation bit for bit.
# Needs root and network namespaces (SKIP, exit 77, with the reason, otherwise).
# Run: ctest -R test_two_nodes   (or, as root: bash tests/slurm/test_two_nodes.sh build/moepeak .)
set -u
bin="$1"
src="$2"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/two_node_slurm.sh
source "$here/two_node_slurm.sh"
if reason=$(two_node_slurm_unsupported); then
  echo "SKIP: test_two_nodes: $reason"
  exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
src=$(cd "$src" && pwd)
tmp=$(mktemp -d)
chmod 755 "$tmp"
trap 'two_node_slurm_stop; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/shell_checks.sh
source "$here/../shell_checks.sh"  # check, contains, report
# shellcheck source=tests/metrics_checks.sh
source "$here/../metrics_checks.sh"  # py, series_match
deadline=$((SECONDS + 280))  # every wait ends by then, inside CTest's timeout
stamp() { echo "[$SECONDS s] $*"; }

if ! two_node_slurm_start "$tmp/c"; then
  echo "FAIL: the two-node Slurm did not start (see the errors and log tails above)"
  echo "0 passed, 1 failed"
  exit 1
fi
slurm_client=on_head
# shellcheck source=tests/slurm/slurm_jobs.sh
source "$here/slurm_jobs.sh"  # job_field, wait_state, requeued, completed, failed
# wait_step FILE N: until the metrics FILE has N lines.
wait_step() {
  while [ $SECONDS -lt $deadline ]; do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "$1 has $(wc -l <"$1" 2>/dev/null) lines, not $2"
  return 1
}
# procs_on NODE COMM: the PIDs of NODE's processes named COMM (moepeak: the job's ranks).
procs_on() {
  local pid comm
  for pid in $(_two_node_pids "$1"); do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    [ "$comm" = "$2" ] && echo "$pid"
  done
  return 0
}
# release JOB: a requeued job starts now (Slurm would hold it about two minutes) once both nodes
# have cleaned up after the earlier run: no step daemon left, and slurmctld sees both idle.
# NOTES: no step daemon is not enough. The ranks and the batch script of a requeued run exit by
# themselves, so a node can be rid of its step daemons before slurmctld's terminate request for
# the old run reaches it; a request that arrives after the new run started there (same job id)
# kills the new ranks with SIGTERM. A node is idle only once it has answered that request.
release() {
  local n1_state n2_state
  while [ $SECONDS -lt $deadline ]; do
    n1_state=$(on_head sinfo -h -n n1 -o %T 2>/dev/null)
    n2_state=$(on_head sinfo -h -n n2 -o %T 2>/dev/null)
    if [ -z "$(procs_on n1 slurmstepd)$(procs_on n2 slurmstepd)" ] && [ "$n1_state" = idle ] &&
      [ "$n2_state" = idle ]; then
      on_head scontrol update jobid="$1" StartTime=now
      return 0
    fi
    sleep 0.2
  done
  echo "release $1: n1 $n1_state, n2 $n2_state, step daemons:" \
    "$(procs_on n1 slurmstepd) $(procs_on n2 slurmstepd)"
  return 1
}
# show_job_log JOB_LOG JOB: after a failed check, the job's log and what slurmctld and the slurmds
# logged about the job.
show_job_log() {
  echo "----- last 30 lines of $1 -----"
  tail -n 30 "$1"
  echo "----- the Slurm logs on job $2 -----"
  grep -h -- "$2" "$tmp/c/log/"*.log | tail -n 40
}
steps=8
config="$src/configs/tiny.toml"
bounded=(--set schedules.dispatch=pipelined_llep --set schedules.chunk_tokens=64
         --set schedules.vocab=ring_dtp --set schedules.checkpoint=sco
         --set optimizer.placement=offload_stream --set optimizer.bucket_params=16384)
common=(--set "training.steps=$steps" --set metrics.progress=off --set runtime.threads=1 "${bounded[@]}")
mkdir -p "$tmp/work"
cd "$tmp/work" || exit 1
# MPI between the nodes over TCP on their one interface; shared memory within a node.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
  OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_btl_vader_single_copy_mechanism=none \
  OMPI_MCA_mpi_yield_when_idle=1
export MOEPEAK="$bin" MOEPEAK_RUN_ROOT="$tmp/work/runs"
# The templates ask for 8 GPUs and 16 cores per rank; these nodes have no GPU and share 2 cores.
submit=(on_head sbatch --parsable --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1)
if [ "$(nproc)" -lt 2 ]; then export MOEPEAK_SRUN_ARGS="-O"; submit+=(-O); fi

# The reference: the same config as one plain process.
timeout 120 "$bin" train --config "$config" "${common[@]}" --set job.run_dir="$tmp/plain" \
  --set job.name=plain >"$tmp/plain.out" 2>&1
check "plain 1-rank train exits 0" test $? -eq 0 || tail -n 20 "$tmp/plain.out"
plain="$tmp/plain/plain/metrics.jsonl"

# 1. One probe file per node.
stamp "1. probe"
MOEPEAK_PROBE_DIR="$tmp/probe" MOEPEAK_PROBE_ARGS="--no-bench" MOEPEAK_RANKS_PER_NODE=2 \
  on_head timeout -k 10 120 sbatch --wait --nodes=2 --gpus-per-node=0 --cpus-per-task=1 \
  -o "$tmp/probe.out" "$src/slurm/probe.sbatch" >/dev/null 2>"$tmp/probe.err"
check "probe.sbatch -N 2 exits 0" test $? -eq 0 || cat "$tmp/probe.err" "$tmp/probe.out"
for node in n1 n2; do
  check "probe-$node.toml is $node's (host = \"$node\")" grep -qx "host = \"$node\"" "$tmp/probe/probe-$node.toml"
done
check "the probe job counted 2 probe files" contains "$tmp/probe.out" "2 probe file(s) in"
export MOEPEAK_PROBE_FILE="$tmp/probe/probe-{host}.toml"

# 2. Training across the two nodes.
stamp "2. train"
job=$("${submit[@]}" --job-name=two "$src/slurm/train.sbatch" "$config" "${common[@]}")
check "the two-node run is COMPLETED with exit 0:0" completed "$job"
log="$tmp/work/two_$job.out"
check "the template logged 2 nodes x 2 ranks" contains "$log" "on 2 node(s) x 2 rank(s)"
# Ranks 0, 1 on n1 and 2, 3 on n2 (srun's block distribution); each bound by itself (task/none
# cannot bind) to its local rank's PU from its own node's probe file.
for r in 0 1 2 3; do
  node=n$((r / 2 + 1)) local=$((r % 2))
  check "rank $r logs node $node, local rank $local, PU $local, $node's probe file" contains "$log" \
    "[rank $r/4] rank $r bound to PUs $local (NUMA node 0; place from $tmp/probe/probe-$node.toml) on host $node, local rank $local of 2 [launcher (SLURM_LOCALID)]"
done
two="$tmp/work/runs/two_$job/metrics.jsonl"
check "two nodes: every step's loss within 1e-5 of one rank's" series_match "$plain" "$two" loss 1e-5
check "two nodes: all $steps steps, world_size 4" "$py" -c "
import json, sys
rows = [json.loads(l) for l in open('$two') if l.strip()]
sys.exit(not ([r['step'] for r in rows] == list(range(1, $steps + 1)) and all(r['world_size'] == 4 for r in rows)))"

# 3. One ZeRO-3 shard group per node, the two nodes replicas of each other.
stamp "3. data_shard 2"
job=$("${submit[@]}" --job-name=shard "$src/slurm/train.sbatch" "$config" "${common[@]}" \
  --set parallelism.data_shard=2)
check "the data_shard = 2 run is COMPLETED with exit 0:0" completed "$job"
check "data_shard = 2: ZeRO-3 over 2 ranks x 2 replicas" contains "$tmp/work/shard_$job.out" \
  "ZeRO-3 dense over 2 x 2 replicas"
check "data_shard = 2: rank 3 on n2, local rank 1" contains "$tmp/work/shard_$job.out" \
  "[rank 3/4] rank 3 bound to PUs 1 (NUMA node 0; place from $tmp/probe/probe-n2.toml) on host n2, local rank 1 of 2"
check "data_shard = 2: every step's loss within 1e-5 of one rank's" \
  series_match "$plain" "$tmp/work/runs/shard_$job/metrics.jsonl" loss 1e-5

# 4. A node without its probe file.
stamp "4. a missing probe file"
mkdir -p "$tmp/probe1"
cp "$tmp/probe/probe-n1.toml" "$tmp/probe1/"
job=$(MOEPEAK_PROBE_FILE="$tmp/probe1/probe-{host}.toml" "${submit[@]}" --job-name=noprobe \
  "$src/slurm/train.sbatch" "$config" "${common[@]}")
check "no probe file for n2: the job FAILED" failed "$job"
check "no probe file for n2: the error names host n2 and its path" contains "$tmp/work/noprobe_$job.out" \
  "no probe file for host n2 ($tmp/probe1/probe-n2.toml does not exist)"

# 5. Preemption: USR1 mid-run, checkpoint, exit 75, requeue, resume.
stamp "5. preemption"
job=$("${submit[@]}" --job-name=pre "$src/slurm/train.sbatch" "$config" "${common[@]}")
pre="$tmp/work/runs/pre_$job/metrics.jsonl"
check "the preempted run gets to step 2" wait_step "$pre" 2
on_head scancel --signal=USR1 --batch "$job"
check "USR1: the two-node job requeues itself" requeued "$job" 1
check "USR1: both nodes clean after the first run" release "$job"
check "USR1: the requeued run is COMPLETED with exit 0:0 after 1 restart" completed "$job" 1 ||
  show_job_log "$tmp/work/pre_$job.out" "$job"
check "USR1: the ranks checkpointed and stopped" contains "$tmp/work/pre_$job.out" "preempted (signal 10) after step"
check "USR1: the second run resumed" contains "$tmp/work/pre_$job.out" "resumed from $tmp/work/runs/pre_$job/"
check "USR1: every step's loss equals the uninterrupted two-node run's, bitwise" \
  series_match "$two" "$pre" loss 0

# 6. A node dies mid-run.
stamp "6. a node dies"
job=$("${submit[@]}" --job-name=dies "$src/slurm/train.sbatch" "$config" "${common[@]}" \
  --set checkpoint.enable=true --set checkpoint.interval=2 --set runtime.collective_timeout=10)
dies="$tmp/work/runs/dies_$job/metrics.jsonl"
check "the run gets past its first checkpoint (step 4)" wait_step "$dies" 4
t0=$SECONDS
two_node_slurm_kill_node n2
gone() {
  local state
  while [ $((SECONDS - t0)) -le 60 ]; do
    state=$(job_field "$job" JobState)
    [ -z "$(procs_on n1 moepeak)" ] && [ "$state" != RUNNING ] && [ "$state" != COMPLETING ] && return 0
    sleep 0.2
  done
  echo "after 60 s: ranks on n1: $(procs_on n1 moepeak | tr '\n' ' '); job $(job_field "$job" JobState)"
  return 1
}
check "n2 dies: no rank left on n1 and the job over within 60 s" gone
state=$(job_field "$job" JobState)
echo "n2 died: the job ended on n1 after $((SECONDS - t0)) s, ${state:-purged}"
check "n2 dies: the watchdog on n1 named the collective, its communicator and the step" \
  grep -qE "collective watchdog: rank [01]: .* on communicator '[a-z_/]+' .* at step [0-9]+" \
  "$tmp/work/dies_$job.out"
latest=$(cat "$tmp/work/runs/dies_$job/checkpoints/latest" 2>/dev/null)
check "n2 dies: a committed checkpoint is latest (${latest:-none})" test -n "$latest"
check "n2 comes back (a fresh slurmd) and is idle" two_node_slurm_start_node n2
# The ranks on n1 usually end the job (FAILED) before Slurm marks n2 down; when Slurm is first, it
# requeues the job (NODE_FAIL of a --requeue job). Either way the run continues on a fresh
# allocation: the requeued job, or a new one given the run's name (train.sbatch's
# MOEPEAK_RUN_NAME).
if [ "$state" = PENDING ]; then
  check "n2 dies: both nodes clean after the first run" release "$job"
  again=$job
else
  again=$(MOEPEAK_RUN_NAME="dies_$job" "${submit[@]}" --job-name=again "$src/slurm/train.sbatch" \
    "$config" "${common[@]}" --set checkpoint.enable=true --set checkpoint.interval=2)
fi
check "n2 dies: the run on a fresh allocation is COMPLETED with exit 0:0" \
  completed "$again" "$([ "$again" = "$job" ] && echo 1 || echo 0)"
again_log="$tmp/work/again_$again.out"
[ "$again" = "$job" ] && again_log="$tmp/work/dies_$job.out"
check "n2 dies: it resumed from $latest" contains "$again_log" \
  "resumed from $tmp/work/runs/dies_$job/checkpoints/$latest"
check "n2 dies: every step's loss equals the uninterrupted two-node run's, bitwise" \
  series_match "$two" "$dies" loss 0

stamp "done"
report test_two_nodes
