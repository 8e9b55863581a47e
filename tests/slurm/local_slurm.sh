# shellcheck shell=bash
# A private single-node Slurm for tests: munged + slurmctld + slurmd with everything (munge key,
# sockets, slurm.conf, state, spool, logs, pid files) under one directory, on TCP ports nobody
# else uses, so several test runs (and a system Slurm, if any) live side by side.
# Source it; do not run it. Works in callers with or without `set -euo pipefail`.
#
#     source tests/slurm/local_slurm.sh
#     dir=$(mktemp -d)
#     trap 'local_slurm_stop; rm -rf "$dir"' EXIT
#     local_slurm_start "$dir" || exit 1     # exports SLURM_CONF; the node is idle on return
#     srun --mpi=pmix -O -n 4 hostname       # or sbatch, squeue, scontrol ... against it
#
# local_slurm_start DIR
#   Needs root (the daemons run as root with SlurmUser=root) and the Debian packages munge,
#   slurmctld, slurmd, slurm-client and libpmix-dev (see scripts/common.sh). DIR is created if
#   needed and must be short (UNIX socket paths under it are limited to 108 bytes); a directory
#   from `mktemp -d` is fine. Every directory above DIR must be searchable by all (munged
#   checks): DIR itself is made 0755, but a parent from `mktemp -d` needs `chmod 755` first.
#   Layout:
#     DIR/slurm.conf  DIR/plugstack.conf (empty: the system's /etc/slurm one is not read)
#     DIR/munge/{munge.key,munge.socket,munged.pid,munged.log,munged.seed}
#     DIR/log/{slurmctld,slurmd}.log  DIR/run/{slurmctld,slurmd}.pid
#     DIR/state (StateSaveLocation)  DIR/spool (SlurmdSpoolDir)  DIR/tmp (TmpFS)
#   One node, "localhost" (127.0.0.1), with this machine's CPUs and RealMemory from `slurmd -C`
#   less 1 GiB, in one partition "debug" (default, no time limit). MpiDefault=none, so MPI jobs
#   need `srun --mpi=pmix`; more tasks than CPUs need `srun -O`.
#   Ports: SlurmctldPort P and SlurmdPort P+1, P even and drawn at random from
#   [LOCAL_SLURM_PORT_MIN, LOCAL_SLURM_PORT_MAX] (default 20000-32000, below Linux's ephemeral
#   range), with neither port in /proc/net/tcp{,6}; choosing and binding happen under a flock on
#   ${TMPDIR:-/tmp}/moepeak-local-slurm.lock so concurrent starts cannot pick the same pair. A
#   daemon that still loses its port to someone else is retried on a new pair (3 tries).
#   FirstJobId = P * 1000: job ids differ between concurrent private clusters, and so do the
#   names derived from them (OpenMPI's shared-memory segments, PMIx directories).
#   Exports SLURM_CONF=DIR/slurm.conf (clients fail without it) and LOCAL_SLURM_DIR, and unsets
#   every other SLURM_* variable of the caller (an inherited SLURM_JOB_ID would make srun look
#   for that job on the private cluster). Waits up to LOCAL_SLURM_TIMEOUT seconds (default 30)
#   for `sinfo` to show the node idle. Returns 0 when it is; otherwise prints an error with the
#   tails of the daemons' logs to stderr, stops whatever it started and returns 1.
#   Jobs inherit SLURM_CONF (sbatch and srun pass the environment on), so srun inside an sbatch
#   script reaches the same cluster; sbatch writes slurm-<jobid>.out in the submitting directory
#   unless given -o.
#
# local_slurm_stop
#   Cancels all jobs, waits for them to leave (up to 15 s), `scontrol shutdown`, waits for the
#   PIDs in the pid files to exit, then `munged -s --socket=...`. Processes that do not exit in
#   time get SIGTERM then SIGKILL, by PID, and only when /proc/PID shows they are this cluster's
#   (DIR in the command line, or a slurmstepd whose environment has this SLURM_CONF). Restores
#   the caller's SLURM_CONF. Safe to call twice, or when start failed or never ran. Leaves DIR
#   (logs) for the caller to remove.
#
# local_slurm_log_tails [LINES]   the last LINES (default 20) lines of each daemon's log, to stderr.

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "local_slurm.sh: source it (source tests/slurm/local_slurm.sh), do not run it" >&2
  exit 2
fi

LOCAL_SLURM_TIMEOUT="${LOCAL_SLURM_TIMEOUT:-30}"
LOCAL_SLURM_PORT_MIN="${LOCAL_SLURM_PORT_MIN:-20000}"
LOCAL_SLURM_PORT_MAX="${LOCAL_SLURM_PORT_MAX:-32000}"

_local_slurm_err() { echo "local_slurm: $*" >&2; }

local_slurm_log_tails() {
  local lines="${1:-20}" f
  [ -n "${LOCAL_SLURM_DIR:-}" ] || return 0
  for f in "$LOCAL_SLURM_DIR/munge/munged.log" "$LOCAL_SLURM_DIR/log/slurmctld.log" \
           "$LOCAL_SLURM_DIR/log/slurmd.log"; do
    echo "----- last $lines lines of $f -----" >&2
    if [ -f "$f" ]; then tail -n "$lines" "$f" >&2; else echo "(no such file)" >&2; fi
  done
}

# True when TCP port $1 appears as a local port in /proc/net/tcp or tcp6 (listening or not).
_local_slurm_port_used() {
  local hex f files=()
  hex=$(printf '%04X' "$1")
  for f in /proc/net/tcp /proc/net/tcp6; do [ -r "$f" ] && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] || return 1
  awk -v p=":$hex" 'FNR > 1 && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    "${files[@]}"
}

# Reads a PID from pid file $1; prints nothing when missing or malformed.
_local_slurm_pid() {
  local pid=""
  if [ -f "$1" ]; then { read -r pid <"$1"; } 2>/dev/null || true; fi
  case "$pid" in ''|*[!0-9]*) return 0 ;; esac
  echo "$pid"
}

# True when PID $1 exists and is not a zombie.
_local_slurm_alive() {
  local stat=""
  [ -n "$1" ] || return 1
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat="${stat##*) }"
  case "${stat%% *}" in Z|X|x|'') return 1 ;; esac
  return 0
}

# True when PID $1 is alive and belongs to this cluster: LOCAL_SLURM_DIR in its command line, or
# a slurmstepd started by this cluster's slurmd (SLURM_CONF in its environment).
_local_slurm_ours() {
  local pid="$1"
  _local_slurm_alive "$pid" || return 1
  local text=""
  text=$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null) || true
  [[ "$text" == *"$LOCAL_SLURM_DIR/"* ]] && return 0
  local comm=""
  { read -r comm <"/proc/$pid/comm"; } 2>/dev/null || true
  [[ "$comm" == slurmstepd* ]] || return 1
  text=$({ tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null) || true
  [[ $'\n'"$text"$'\n' == *$'\n'"SLURM_CONF=$LOCAL_SLURM_DIR/slurm.conf"$'\n'* ]]
}

# _local_slurm_wait_gone SECONDS PID...: waits until none of the PIDs is alive; false on timeout.
_local_slurm_wait_gone() {
  local deadline=$((SECONDS + $1)) pid alive; shift
  while :; do
    alive=0
    for pid in "$@"; do _local_slurm_alive "$pid" && alive=1; done
    [ $alive -eq 0 ] && return 0
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}

# _local_slurm_end NAME PID...: SIGTERM, then (after 10 s) SIGKILL, the PIDs that are still
# alive and ours.
_local_slurm_end() {
  local name="$1" pid; shift
  for pid in "$@"; do
    _local_slurm_ours "$pid" || continue
    kill -TERM "$pid" 2>/dev/null || true
    _local_slurm_wait_gone 10 "$pid" && continue
    _local_slurm_ours "$pid" || continue
    _local_slurm_err "$name (pid $pid) did not stop on SIGTERM: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    _local_slurm_wait_gone 5 "$pid" || _local_slurm_err "$name (pid $pid) survived SIGKILL"
  done
  return 0
}

# This cluster's slurmstepd processes.
_local_slurm_stepds() {
  local p comm
  for p in /proc/[0-9]*; do
    comm=""
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    if [[ "$comm" == slurmstepd* ]] && _local_slurm_ours "${p#/proc/}"; then echo "${p#/proc/}"; fi
  done
  return 0
}

# _local_slurm_munge_start MDIR: a fresh key and a munged with everything under MDIR (which must
# exist, 0755): munge.key, munge.socket, munged.{pid,log,seed,out}. False, with the reason, when
# it does not start. Shared with two_node_slurm.sh.
_local_slurm_munge_start() {
  local m="$1"
  if ! mungekey --create --force --keyfile="$m/munge.key" >"$m/mungekey.out" 2>&1; then
    _local_slurm_err "mungekey failed: $(cat "$m/mungekey.out")"
    return 1
  fi
  chmod 600 "$m/munge.key"
  if ! munged --key-file="$m/munge.key" --socket="$m/munge.socket" --pid-file="$m/munged.pid" \
       --log-file="$m/munged.log" --seed-file="$m/munged.seed" </dev/null >"$m/munged.out" 2>&1; then
    _local_slurm_err "munged failed to start: $(cat "$m/munged.out")"
    return 1
  fi
}

# _local_slurm_munge_stop MDIR: stops the munged of MDIR (by its pid file, only when the process's
# command line names MDIR); safe when none runs.
_local_slurm_munge_stop() {
  local m="$1" pid text=""
  pid=$(_local_slurm_pid "$m/munged.pid")
  _local_slurm_alive "$pid" || return 0
  text=$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null) || true
  [[ "$text" == *"$m/"* ]] || return 0
  munged -s --socket="$m/munge.socket" >/dev/null 2>&1 || true
  if ! _local_slurm_wait_gone 10 "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    _local_slurm_wait_gone 5 "$pid" || kill -KILL "$pid" 2>/dev/null || true
  fi
  return 0
}

# _local_slurm_common_conf DIR: the slurm.conf lines every private cluster shares (root daemons,
# munge through DIR's socket, state, logs and TmpFS under DIR, no cgroups, accounting or mail,
# cores as the unit, MPI only through `srun --mpi=...`, jobs purged 2 s after they end).
_local_slurm_common_conf() {
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$1/munge/munge.socket
StateSaveLocation=$1/state
TmpFS=$1/tmp
SlurmctldPidFile=$1/run/slurmctld.pid
SlurmctldLogFile=$1/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$1/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=2
KillWait=5
InactiveLimit=0
EOF
}

_local_slurm_write_conf() {  # _local_slurm_write_conf CTLD_PORT
  local dir="$LOCAL_SLURM_DIR" port="$1" node cpus boards sockets cores threads mem
  node=$(slurmd -C 2>/dev/null | head -n 1) || true
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  boards=$(sed -n 's/.*Boards=\([0-9]*\).*/\1/p' <<<"$node")
  sockets=$(sed -n 's/.*SocketsPerBoard=\([0-9]*\).*/\1/p' <<<"$node")
  cores=$(sed -n 's/.*CoresPerSocket=\([0-9]*\).*/\1/p' <<<"$node")
  threads=$(sed -n 's/.*ThreadsPerCore=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  if [ -z "$cpus" ] || [ -z "$mem" ]; then
    _local_slurm_err "\`slurmd -C\` gave no CPUs/RealMemory: '$node'"
    return 1
  fi
  mem=$((mem > 2048 ? mem - 1024 : mem / 2))
  local topo="CPUs=$cpus"
  if [ -n "$boards" ] && [ -n "$sockets" ] && [ -n "$cores" ] && [ -n "$threads" ]; then
    topo="$topo Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads"
  fi
  : >"$dir/plugstack.conf"
  cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/local_slurm.sh: a private single-node Slurm under $dir.
ClusterName=moepeak$port
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/run/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log
FirstJobId=$((port * 1000))
$(_local_slurm_common_conf "$dir")
NodeName=localhost NodeAddr=127.0.0.1 $topo RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

# One try at slurmctld + slurmd on a fresh port pair, under the port lock. Returns 0 when the node
# is idle, 2 when a daemon lost its port (retry), 1 on any other failure.
_local_slurm_try_daemons() {
  local dir="$LOCAL_SLURM_DIR" lock_fd port="" tries=0 rc=1 state ctld slurmd deadline
  exec {lock_fd}>"${TMPDIR:-/tmp}/moepeak-local-slurm.lock"
  flock "$lock_fd"
  local span=$(((LOCAL_SLURM_PORT_MAX - LOCAL_SLURM_PORT_MIN) / 2))
  while [ $tries -lt 200 ]; do
    tries=$((tries + 1))
    local p=$((LOCAL_SLURM_PORT_MIN + 2 * ((RANDOM * 32768 + RANDOM) % span)))
    if ! _local_slurm_port_used "$p" && ! _local_slurm_port_used $((p + 1)); then port=$p; break; fi
  done
  if [ -z "$port" ]; then
    _local_slurm_err "no free port pair in $LOCAL_SLURM_PORT_MIN-$LOCAL_SLURM_PORT_MAX"
    exec {lock_fd}>&-
    return 1
  fi
  _local_slurm_write_conf "$port" || { exec {lock_fd}>&-; return 1; }
  rm -f "$dir/run/slurmctld.pid" "$dir/run/slurmd.pid"
  # A fresh cluster each try (slurmctld refuses state saved under another ClusterName).
  rm -rf "${dir:?}/state" "${dir:?}/spool" && mkdir -p "$dir/state" "$dir/spool"
  local f
  for f in slurmctld.log slurmd.log slurmctld.out slurmd.out; do  # keep a failed try's logs
    [ -f "$dir/log/$f" ] && mv -f "$dir/log/$f" "$dir/log/$f.prev"
  done
  # The daemons must not inherit the lock's descriptor (they would hold the lock for life).
  if ! slurmctld -c -f "$dir/slurm.conf" {lock_fd}>&- </dev/null >>"$dir/log/slurmctld.out" 2>&1; then
    _local_slurm_err "slurmctld failed to start (see $dir/log/slurmctld.out)"
    cat "$dir/log/slurmctld.out" >&2
  elif ! slurmd -f "$dir/slurm.conf" -N localhost {lock_fd}>&- </dev/null >>"$dir/log/slurmd.out" 2>&1; then
    _local_slurm_err "slurmd failed to start (see $dir/log/slurmd.out)"
    cat "$dir/log/slurmd.out" >&2
  else
    deadline=$((SECONDS + LOCAL_SLURM_TIMEOUT))
    while :; do
      state=$(sinfo -h -n localhost -o %T 2>/dev/null) || state=""
      if [ "$state" = "idle" ]; then rc=0; break; fi
      ctld=$(_local_slurm_pid "$dir/run/slurmctld.pid")
      slurmd=$(_local_slurm_pid "$dir/run/slurmd.pid")
      if { [ -n "$ctld" ] && ! _local_slurm_alive "$ctld"; } ||
         { [ -n "$slurmd" ] && ! _local_slurm_alive "$slurmd"; }; then
        if grep -qs "Address already in use" "$dir/log/slurmctld.log" "$dir/log/slurmd.log"; then
          rc=2
          _local_slurm_err "ports $port/$((port + 1)) were taken meanwhile; retrying on others"
        else
          _local_slurm_err "a daemon exited during start-up (node state '${state:-unknown}')"
        fi
        break
      fi
      if [ $SECONDS -ge $deadline ]; then
        _local_slurm_err "the node is not idle after ${LOCAL_SLURM_TIMEOUT}s (sinfo says '${state:-nothing}')"
        break
      fi
      sleep 0.2
    done
  fi
  exec {lock_fd}>&-
  return $rc
}

# _local_slurm_cancel_and_shutdown [CLIENT...]: cancels every job, waits up to 15 s for the queue
# to empty, then `scontrol shutdown` (slurmctld and every registered slurmd). The clients run
# through the command prefix CLIENT when given (two_node_slurm.sh: on_head). Shared with
# two_node_slurm.sh.
# shellcheck disable=SC2120  # two_node_slurm.sh passes CLIENT
_local_slurm_cancel_and_shutdown() {
  local deadline=$((SECONDS + 15))
  "$@" timeout 10 scancel --user="$(id -un)" >/dev/null 2>&1 || true
  while [ -n "$("$@" timeout 10 squeue -h -o %i 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do
    sleep 0.2
  done
  "$@" timeout 10 scontrol shutdown >/dev/null 2>&1 || true
}

# Stops slurmctld and slurmd (not munged): cancel jobs, scontrol shutdown, wait, then by PID.
_local_slurm_stop_daemons() {
  local dir="$LOCAL_SLURM_DIR" ctld slurmd
  ctld=$(_local_slurm_pid "$dir/run/slurmctld.pid")
  slurmd=$(_local_slurm_pid "$dir/run/slurmd.pid")
  if [ -n "$ctld" ] && _local_slurm_ours "$ctld"; then
    # shellcheck disable=SC2119  # here the clients run in this namespace: no CLIENT
    _local_slurm_cancel_and_shutdown
    local pids=() pid
    for pid in $ctld $slurmd; do _local_slurm_ours "$pid" && pids+=("$pid"); done
    [ ${#pids[@]} -eq 0 ] || _local_slurm_wait_gone 20 "${pids[@]}" || true
    _local_slurm_end slurmctld "$ctld"
  fi
  # Without a slurmctld (a failed start) nothing tells slurmd to stop: SIGTERM is its normal stop.
  _local_slurm_end slurmd "$slurmd"
  # Steps of jobs that outlived their slurmd (a hung task): end them too.
  local stepds
  stepds=$(_local_slurm_stepds)
  if [ -n "$stepds" ]; then
    # shellcheck disable=SC2046,SC2086
    _local_slurm_wait_gone 5 $stepds || _local_slurm_end slurmstepd $(_local_slurm_stepds)
  fi
  rm -f "$dir/run/slurmctld.pid" "$dir/run/slurmd.pid"
  return 0
}

local_slurm_start() {
  if [ $# -ne 1 ] || [ -z "$1" ]; then _local_slurm_err "usage: local_slurm_start DIR"; return 1; fi
  if [ -n "${LOCAL_SLURM_DIR:-}" ]; then
    _local_slurm_err "already running under $LOCAL_SLURM_DIR (call local_slurm_stop first)"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    _local_slurm_err "needs root (the private Slurm runs its daemons as root, SlurmUser=root)"
    return 1
  fi
  local missing=() tool
  for tool in munged mungekey slurmctld slurmd sinfo squeue scontrol scancel srun flock timeout; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    _local_slurm_err "missing ${missing[*]} (Debian: munge slurmctld slurmd slurm-client; scripts/test.sh installs them)"
    return 1
  fi
  mkdir -p "$1" || return 1
  local dir
  dir=$(cd "$1" && pwd) || return 1
  # Longest socket: DIR/spool/localhost_<jobid>.<stepid> and stepd.slurm.pmix.<jobid>.<stepid>.
  if [ ${#dir} -gt 60 ]; then
    _local_slurm_err "DIR '$dir' is too long for UNIX socket paths (max 60 characters; use mktemp -d)"
    return 1
  fi
  # munged wants every directory on its socket's path searchable by all and writable only by
  # its owner.
  chmod 755 "$dir"
  local up="${dir%/*}"
  while [ -n "$up" ]; do
    if [ -z "$(find "$up" -maxdepth 0 -perm -o+x 2>/dev/null)" ]; then
      _local_slurm_err "munged needs every directory above its socket searchable by all:" \
        "'$up' is not (chmod a+x it; a \`mktemp -d\` parent is 0700)"
      return 1
    fi
    up="${up%/*}"
  done
  mkdir -p "$dir/munge" "$dir/log" "$dir/run" "$dir/state" "$dir/spool" "$dir/tmp" || return 1
  chmod 755 "$dir/munge"

  LOCAL_SLURM_DIR="$dir"
  LOCAL_SLURM_SAVED_CONF="${SLURM_CONF-__unset__}"
  local var
  for var in $(compgen -e SLURM_); do unset "$var"; done
  export LOCAL_SLURM_DIR
  export SLURM_CONF="$dir/slurm.conf"

  if ! _local_slurm_munge_start "$dir/munge"; then
    local_slurm_log_tails 20
    local_slurm_stop
    return 1
  fi

  local rc=1
  for _ in 1 2 3; do
    rc=0
    _local_slurm_try_daemons || rc=$?
    [ $rc -eq 2 ] || break
    _local_slurm_stop_daemons
  done
  if [ $rc -ne 0 ]; then
    _local_slurm_err "could not start a private Slurm under $dir"
    local_slurm_log_tails 20
    local_slurm_stop
    return 1
  fi
  return 0
}

local_slurm_stop() {
  [ -n "${LOCAL_SLURM_DIR:-}" ] || return 0
  local dir="$LOCAL_SLURM_DIR"
  _local_slurm_stop_daemons
  _local_slurm_munge_stop "$dir/munge"
  if [ "${LOCAL_SLURM_SAVED_CONF:-__unset__}" = "__unset__" ]; then
    unset SLURM_CONF
  else
    export SLURM_CONF="$LOCAL_SLURM_SAVED_CONF"
  fi
  unset LOCAL_SLURM_DIR LOCAL_SLURM_SAVED_CONF
  return 0
}
