#!/usr/bin/env bash
# Faults on real rank processes (docs/reliability.md), each injected by MOEPEAK_FAULT
# (core/fault_injection.h) into `moepeak train` of configs/tiny.toml under mpirun:
#   - kill -9 of one of 4 ranks at a step's start, inside a collective, and half-way through its
#     checkpoint shard: the job ends non-zero within 60 s (mpirun ends the others when a rank
#     dies), the last committed checkpoint is `latest`, and --resume continues from it to the
#     uninterrupted run's losses, bit for bit;
#   - SIGUSR1 and SIGTERM raised on every rank half-way through a save: the save completes, the
#     job exits 75, and --resume continues bit for bit;
#   - a full disk (ENOSPC) half-way through one rank's shard: a clear error naming the file, the
#     previous checkpoint still `latest`, no part-written directory left;
#   - a non-finite gradient norm or loss: training.on_nonfinite = "stop" names the step and the
#     first non-finite live set and saves nothing of that step; "skip" drops the update, counts
#     it in the metrics and goes on, and stops after training.max_skipped_steps in a row;
#   - a slow rank: one rank 4 s late at a step's start with the default watchdog: the job waits
#     and ends with the uninterrupted losses; 60 s late with runtime.collective_timeout = 3: the
#     watchdog ends the job (exit 3) within 30 s, naming the waiting rank, the operation, its
#     communicator and the step.
# Every run is under `timeout 120`: a hang is a failure (exit 124), not a blocked test.
# Run: ctest -R test_faults   (or: OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
#   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash tests/faults/test_faults.sh
#   build/moepeak "$(which mpirun)" .)
set -u
bin="$1"
mpirun="$2"
src="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
# shellcheck source=tests/metrics_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../metrics_checks.sh"  # py, series_match
is_failure() { test "$1" -ne 0 && test "$1" -ne 124; }  # non-zero, and not the timeout's 124

# train W NAME [ARGS...]: `moepeak train` of configs/tiny.toml on W ranks as job NAME under
# $tmp/runs, 6 steps with a checkpoint every 2; output in $tmp/NAME.out/.err; MOEPEAK_FAULT
# (when set) reaches every rank. Sets rc and secs (the job's wall seconds).
train() {
  local w="$1" name="$2"; shift 2
  local start=$SECONDS
  timeout -k 10 120 "$mpirun" --allow-run-as-root --oversubscribe -x MOEPEAK_FAULT -np "$w" \
    "$bin" train --config "$src/configs/tiny.toml" --set metrics.progress=off \
    --set job.run_dir="$tmp/runs" --set job.name="$name" --set training.steps=6 \
    --set checkpoint.enable=true --set checkpoint.interval=2 --set runtime.threads=1 "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
  rc=$?
  secs=$((SECONDS - start))
}
metrics() { echo "$tmp/runs/$1/metrics.jsonl"; }
ckpt() { echo "$tmp/runs/$1/checkpoints"; }
export MOEPEAK_FAULT=""

# The uninterrupted runs the others are compared with.
train 4 ref4; check "reference on 4 ranks exits 0 (rc $rc)" test $rc -eq 0
train 2 ref2; check "reference on 2 ranks exits 0 (rc $rc)" test $rc -eq 0

# 1. kill -9 of rank 1 of 4: at step 5's start, in step 5's first collective, half-way through
# its shard of step 4's save. The last committed checkpoint: step 4, step 4, step 2.
for spec in step:5:4 collective:5:4 save_shard:4:2; do
  IFS=: read -r point step last <<<"$spec"
  name="kill_$point"
  MOEPEAK_FAULT="kill@$point,rank=1,step=$step" train 4 "$name"
  echo "kill -9 of rank 1 of 4 at $point (step $step): the job ended in $secs s, rc $rc"
  check "kill -9 at $point: the job fails (rc $rc)" is_failure $rc
  check "kill -9 at $point: every rank gone within 60 s ($secs s)" test "$secs" -le 60
  check "kill -9 at $point: latest names step $last" \
    grep -qx "step_0000000$last" "$(ckpt "$name")/latest"
  check "kill -9 at $point: no later checkpoint" test ! -e "$(ckpt "$name")/step_00000006"
  MOEPEAK_FAULT="" train 4 "$name" --resume
  check "kill -9 at $point: --resume exits 0 (rc $rc)" test $rc -eq 0
  check "kill -9 at $point: it resumed after step $last" contains "$tmp/$name.err" \
    "after step $last"
  check "kill -9 at $point: the resumed steps equal the uninterrupted run's, bitwise" \
    series_match "$(metrics ref4)" "$(metrics "$name")" loss 0
done

# 2. A preemption signal on every rank half-way through step 4's save: the save completes, the
# job stops at that step boundary with exit 75, and the requeued job continues bit for bit.
for sig in usr1 term; do
  name="signal_$sig"
  MOEPEAK_FAULT="$sig@save_shard,step=4" train 2 "$name"
  check "$sig during a save: exit 75 (rc $rc)" test $rc -eq 75
  check "$sig during a save: latest names step 4" grep -qx step_00000004 "$(ckpt "$name")/latest"
  check "$sig during a save: step 4 is whole" test -s "$(ckpt "$name")/step_00000004/manifest.json"
  check "$sig during a save: no temporary directory left" \
    test -z "$(find "$(ckpt "$name")" -maxdepth 1 -name '.tmp_*')"
  MOEPEAK_FAULT="" train 2 "$name" --resume
  check "$sig during a save: --resume exits 0 (rc $rc)" test $rc -eq 0
  check "$sig during a save: steps 5..6 equal the uninterrupted run's, bitwise" \
    series_match "$(metrics ref2)" "$(metrics "$name")" loss 0
done

# 3. The disk full half-way through rank 1's shard of step 4.
MOEPEAK_FAULT="enospc@save_write,rank=1,step=4" train 2 enospc
check "disk full: the job fails (rc $rc)" is_failure $rc
check "disk full: the error names the file and the cause" contains "$tmp/enospc.err" \
  "shard-00001.bin: No space left on device"
check "disk full: latest still names step 2" grep -qx step_00000002 "$(ckpt enospc)/latest"
check "disk full: step 2 is whole" test -s "$(ckpt enospc)/step_00000002/manifest.json"
check "disk full: no step 4 and no part-written directory" \
  test -z "$(find "$(ckpt enospc)" -maxdepth 1 \( -name '.tmp_*' -o -name step_00000004 \))"

# 4. Non-finite values. A NaN gradient at step 3, on_nonfinite = "stop" (the default).
MOEPEAK_FAULT="nan@grads,rank=1,step=3" train 2 nan_stop
check "non-finite gradient, stop: the job fails (rc $rc)" is_failure $rc
check "non-finite gradient, stop: the error names the step and the live set" \
  grep -qE "step 3: the loss is .* and the gradient norm nan; the first non-finite live set is grads \(.* gradient, on rank 1\)" "$tmp/nan_stop.err"
check "non-finite gradient, stop: latest names step 2" \
  grep -qx step_00000002 "$(ckpt nan_stop)/latest"
# "skip": step 3's update is dropped, the run goes on and counts it.
MOEPEAK_FAULT="nan@grads,rank=1,step=3" train 2 nan_skip --set training.on_nonfinite=skip
check "non-finite gradient, skip: the job exits 0 (rc $rc)" test $rc -eq 0
check "non-finite gradient, skip: steps 1..2 equal the uninterrupted run's, bitwise" \
  series_match "$(metrics ref2)" <(head -n 2 "$(metrics nan_skip)") loss 0
check "non-finite gradient, skip: the metrics mark step 3 skipped and count it after" \
  "$py" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
got = [(r["step"], r["skipped"], r["skipped_steps"]) for r in rows]
want = [(1, False, 0), (2, False, 0), (3, True, 1), (4, False, 1), (5, False, 1), (6, False, 1)]
sys.exit(0 if got == want else f"  {got}")' "$(metrics nan_skip)"
# A NaN weight written by step 2's update: every later step is non-finite; skip stops after 2.
MOEPEAK_FAULT="nan@weights,rank=0,step=2" train 2 nan_weights --set training.on_nonfinite=skip \
  --set training.max_skipped_steps=2
check "non-finite weight, skip: the job fails (rc $rc)" is_failure $rc
check "non-finite weight, skip: it stops after 2 skipped steps and names the weight" \
  grep -qE "step 4: 2 steps in a row had a non-finite loss or gradient norm .* the first non-finite live set is weights \(model\..*, on rank 0\)" "$tmp/nan_weights.err"

# 5. A slow rank. 4 s late at step 3 under the default timeout: the others wait.
MOEPEAK_FAULT="delay@step,rank=1,step=3,seconds=4" train 2 slow
check "a rank 4 s late: the job exits 0 (rc $rc)" test $rc -eq 0
check "a rank 4 s late: the losses equal the uninterrupted run's, bitwise" \
  series_match "$(metrics ref2)" "$(metrics slow)" loss 0
# 60 s late with a 3 s timeout: the watchdog ends the job.
MOEPEAK_FAULT="delay@step,rank=1,step=3,seconds=60" train 2 hung --set runtime.collective_timeout=3
echo "a rank 60 s late, runtime.collective_timeout = 3: the job ended in $secs s, rc $rc"
check "a rank 60 s late, 3 s timeout: the watchdog ends the job with exit 3 (rc $rc)" \
  test $rc -eq 3
check "a rank 60 s late, 3 s timeout: within 30 s ($secs s)" test "$secs" -le 30
check "a rank 60 s late: the watchdog names the rank, the operation, the communicator, the step" \
  grep -qE "collective watchdog: rank 0: [a-z_]+ on communicator 'world' \(rank 0 of 2\) has not completed after [0-9.]+ s \(runtime.collective_timeout = 3 s\), at step 3" "$tmp/hung.err"

# 6. A malformed MOEPEAK_FAULT is an error, not a silently healthy run.
MOEPEAK_FAULT="explode@step" train 2 bad_spec
check "a malformed MOEPEAK_FAULT: the job fails (rc $rc)" is_failure $rc
check "a malformed MOEPEAK_FAULT: the error says what is wrong" contains "$tmp/bad_spec.err" \
  "MOEPEAK_FAULT 'explode@step': unknown action 'explode'"

report test_faults
