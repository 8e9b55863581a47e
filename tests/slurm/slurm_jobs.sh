# shellcheck shell=bash
# Following Slurm jobs in the tests of a private cluster (test_sbatch_train, test_two_nodes).
# Source it; set `deadline` (the value of SECONDS by which every wait gives up) before waiting,
# and `slurm_client` to a command prefix where the clients must run elsewhere (on_head for the
# two-node cluster; empty: here). It defines
#   job_field JOB FIELD        a field of `scontrol show job` (empty once the job is purged)
#   wait_state JOB STATE...    until the job is in one of the states; false at the deadline
#   requeued JOB RESTARTS      until the job is PENDING again after RESTARTS requeues; false when
#                              it completes instead
#   completed JOB [RESTARTS]   the job ends COMPLETED with exit 0:0 after RESTARTS (default 0)
#   failed JOB                 the job ends FAILED
# shellcheck disable=SC2154  # deadline is the caller's
slurm_client="${slurm_client:-}"
_slurm_client() { if [ -n "$slurm_client" ]; then "$slurm_client" "$@"; else "$@"; fi; }

job_field() {
  _slurm_client scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

wait_state() {
  local job="$1" state s
  shift
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(job_field "$job" JobState)
    for s in "$@"; do [ "$state" = "$s" ] && return 0; done
    sleep 0.2
  done
  echo "job $job is $(job_field "$job" JobState), not $*"
  return 1
}

requeued() {
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ "$(job_field "$1" Restarts)" = "$2" ] && [ "$(job_field "$1" JobState)" = PENDING ] && return 0
    [ "$(job_field "$1" JobState)" = COMPLETED ] && { echo "it completed without a requeue"; return 1; }
    sleep 0.2
  done
  echo "state $(job_field "$1" JobState), restarts $(job_field "$1" Restarts)"
  return 1
}

completed() {
  wait_state "$1" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL || return 1
  local got want="COMPLETED 0:0 ${2:-0}"
  got="$(job_field "$1" JobState) $(job_field "$1" ExitCode) $(job_field "$1" Restarts)"
  [ "$got" = "$want" ] || { echo "job $1: $got, not $want"; return 1; }
}

failed() {
  wait_state "$1" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL || return 1
  [ "$(job_field "$1" JobState)" = FAILED ] || { echo "job $1 is $(job_field "$1" JobState)"; return 1; }
}
