# shellcheck shell=bash
# A private two-node Slurm for tests: nodes n1 and n2, each a network namespace with its own
# hostname (a UTS namespace per daemon, all named after their node) and its own slurmd, joined by
# veth pairs on a bridge that lives in a third namespace (the switch). slurmctld runs on n1, the
# head node; munged runs in the caller's namespace (its socket is a file, which every network
# namespace reaches). Nothing is configured in the caller's namespace: no interface, address or
# route; the namespaces and everything in them go at stop. Source it; do not run it.
#
#     source tests/slurm/two_node_slurm.sh
#     reason=$(two_node_slurm_unsupported) && { echo "SKIP: $reason"; exit 77; }
#     dir=$(mktemp -d); chmod 755 "$dir"
#     trap 'two_node_slurm_stop; rm -rf "$dir"' EXIT
#     two_node_slurm_start "$dir/c" || exit 1    # exports SLURM_CONF; both nodes idle on return
#     on_head sbatch -N 2 --ntasks-per-node=2 job.sh    # clients run on the head node, n1
#     on_head srun --mpi=pmix -N 2 hostname             # n1, n2
#     two_node_slurm_kill_node n2    # SIGKILL every process on n2: a node that loses power
#     two_node_slurm_start_node n2   # a fresh slurmd on n2; true once the node is idle again
#
# two_node_slurm_unsupported
#   Prints why this machine cannot host the cluster and returns 0 (not root; no ip, unshare,
#   munged, slurmctld, slurmd or srun; network namespaces, veth pairs or bridges that cannot be
#   made), or prints nothing and returns 1. It makes and removes a scratch namespace to find out.
#
# two_node_slurm_start DIR
#   Layout (DIR short, as for local_slurm.sh: UNIX sockets live under it, every directory above
#   it searchable by all):
#     DIR/slurm.conf  DIR/plugstack.conf  DIR/munge/  DIR/state/
#     DIR/spool/{n1,n2}/  DIR/local/{n1,n2}/ (each node's TmpFS, seen there as DIR/tmp)
#     DIR/log/{slurmctld,slurmd-n1,slurmd-n2}.log  DIR/run/*.pid  DIR/hosts
#   Namespaces mpk<ID>n1, mpk<ID>n2 and mpk<ID>sw (ID: this shell's PID), addresses 10.250.0.1
#   (n1) and 10.250.0.2 (n2) on eth0 in each node, DIR/hosts naming both nodes (each node's
#   daemons see it as /etc/hosts). Each node has this machine's CPUs and
#   memory (`slurmd -C`): the two nodes share the machine's cores. Partition "debug", MpiDefault
#   none (MPI jobs use `srun --mpi=pmix`), SlurmdTimeout 10 s, so a dead node is noticed soon,
#   ReturnToService 2, so a restarted slurmd brings its node back. FirstJobId differs per cluster
#   (1000 x (1000 + ID mod 60000)), so concurrent clusters' OpenMPI and PMIx files, named after
#   job ids and host names, do not meet. Exports SLURM_CONF and TWO_NODE_SLURM_DIR and unsets the
#   caller's other SLURM_* variables. Waits up to LOCAL_SLURM_TIMEOUT seconds (default 30) for
#   both nodes to be idle; on failure prints the reason and the logs' tails, stops what it
#   started and returns 1.
#
# on_head CMD...        CMD in the head node's network namespace (slurm clients reach slurmctld
#                       only from there); the environment passes on.
# on_node NODE CMD...   CMD on NODE (network and hostname).
# two_node_slurm_kill_node NODE   SIGKILL to every process in NODE's network namespace (its
#                       slurmd, step daemons and tasks), by PID; waits until they are gone.
# two_node_slurm_start_node NODE  starts NODE's slurmd again; true once sinfo shows it idle.
# two_node_slurm_stop   cancels jobs, `scontrol shutdown`, SIGKILL to whatever is left in the
#                       namespaces, stops munged, deletes the namespaces.
#                       Safe to call twice, or when start failed. Leaves DIR (logs).
# two_node_slurm_log_tails [LINES]   the daemons' logs' last LINES lines, to stderr.

here_two_node_slurm=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/local_slurm.sh
source "$here_two_node_slurm/local_slurm.sh"  # the pid, wait, munge and shutdown helpers

_two_node_err() { echo "two_node_slurm: $*" >&2; }
_two_node_ns() { echo "mpk${TWO_NODE_SLURM_ID}$1"; }  # _two_node_ns n1|n2|sw

two_node_slurm_unsupported() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "needs root (network namespaces, and Slurm's daemons as root)"
    return 0
  fi
  local tool
  for tool in ip nsenter unshare munged mungekey slurmctld slurmd sinfo srun sbatch scontrol; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "no '$tool' (Debian: iproute2 util-linux munge slurmctld slurmd slurm-client)"
      return 0
    fi
  done
  local ns="mpkprobe$$" why=""
  if ! why=$(ip netns add "$ns" 2>&1); then
    echo "cannot make a network namespace ($why)"
    return 0
  fi
  if ! why=$(ip -n "$ns" link add br0 type bridge 2>&1); then
    ip netns del "$ns" 2>/dev/null
    echo "cannot make a bridge in a network namespace ($why)"
    return 0
  fi
  if ! why=$(ip -n "$ns" link add v0 type veth peer name v1 2>&1); then
    ip netns del "$ns" 2>/dev/null
    echo "cannot make a veth pair ($why)"
    return 0
  fi
  if ! why=$(ip netns exec "$ns" unshare --uts hostname mpkprobe 2>&1); then
    ip netns del "$ns" 2>/dev/null
    echo "cannot make a UTS namespace ($why)"
    return 0
  fi
  ip netns del "$ns" 2>/dev/null
  return 1
}

# NOTES: nsenter, not `ip netns exec`: the latter remounts /sys for the namespace, which hides
# /sys/fs/cgroup, and slurmd will not start without it. A node's processes see, through bind
# mounts in a mount namespace of their own, DIR/hosts (both nodes' names) as /etc/hosts and
# their node's DIR/local/NODE as DIR/tmp (TmpFS: node-local, as on a real cluster, where the
# PMIx plugin keeps per-step directories that the two nodes must not share).
on_head() { nsenter --net="/run/netns/$(_two_node_ns n1)" "$@"; }

on_node() {
  local node="$1"
  shift
  local dir="$TWO_NODE_SLURM_DIR"
  # shellcheck disable=SC2016  # the inner shell expands $0 and $1
  nsenter --net="/run/netns/$(_two_node_ns "$node")" unshare --uts --mount sh -c \
    'mount --bind "$1/hosts" /etc/hosts && mount --bind "$1/local/$0" "$1/tmp" && hostname "$0" &&
     shift && exec "$@"' "$node" "$dir" "$@"
}

two_node_slurm_log_tails() {
  local lines="${1:-20}" f
  [ -n "${TWO_NODE_SLURM_DIR:-}" ] || return 0
  for f in "$TWO_NODE_SLURM_DIR"/munge/munged.log "$TWO_NODE_SLURM_DIR"/log/*.log; do
    echo "----- last $lines lines of $f -----" >&2
    tail -n "$lines" "$f" >&2 2>/dev/null || echo "(no such file)" >&2
  done
}

# Every process in NODE's network namespace (none when the namespace does not exist).
_two_node_pids() { ip netns pids "$(_two_node_ns "$1")" 2>/dev/null || true; }

# _two_node_wait_idle SECONDS NODE...: until sinfo shows every NODE idle.
_two_node_wait_idle() {
  local deadline=$((SECONDS + $1)) node state all
  shift
  while :; do
    all=1
    for node in "$@"; do
      state=$(on_head sinfo -h -n "$node" -o %T 2>/dev/null) || state=""
      [ "$state" = idle ] || all=0
    done
    [ $all -eq 1 ] && return 0
    if [ $SECONDS -ge $deadline ]; then
      _two_node_err "after $1 s: $(on_head sinfo -h -N -o '%N %T' 2>&1 | tr '\n' ' ')"
      return 1
    fi
    sleep 0.2
  done
}

_two_node_write_conf() {
  local dir="$TWO_NODE_SLURM_DIR" node cpus mem
  node=$(slurmd -C 2>/dev/null | head -n 1) || true
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  if [ -z "$cpus" ] || [ -z "$mem" ]; then
    _two_node_err "\`slurmd -C\` gave no CPUs/RealMemory: '$node'"
    return 1
  fi
  # The two nodes share the machine's memory.
  mem=$((mem / 2 > 1024 ? mem / 2 - 512 : mem / 2))
  : >"$dir/plugstack.conf"
  cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/two_node_slurm.sh: a private two-node Slurm under $dir.
ClusterName=moepeak2n
SlurmctldHost=n1(10.250.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdTimeout=10
FirstJobId=$((1000 * (1000 + TWO_NODE_SLURM_ID % 60000)))
$(_local_slurm_common_conf "$dir")
NodeName=n1 NodeAddr=10.250.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeAddr=10.250.0.2 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
}

# The network: namespaces n1, n2 and the switch, a bridge in the switch, a veth pair per node.
_two_node_make_network() {
  local sw k ns
  sw=$(_two_node_ns sw)
  ip netns add "$sw" || return 1
  ip -n "$sw" link add br0 type bridge || return 1
  ip -n "$sw" link set br0 up || return 1
  ip -n "$sw" link set lo up || return 1
  for k in 1 2; do
    ns=$(_two_node_ns "n$k")
    ip netns add "$ns" || return 1
    ip -n "$sw" link add "port$k" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$sw" link set "port$k" master br0 || return 1
    ip -n "$sw" link set "port$k" up || return 1
    ip -n "$ns" addr add "10.250.0.$k/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
  done
  printf '127.0.0.1 localhost\n10.250.0.1 n1\n10.250.0.2 n2\n' >"$TWO_NODE_SLURM_DIR/hosts"
}

# Starts NODE's slurmd (it daemonizes); false when it does not start.
_two_node_start_slurmd() {
  local node="$1" dir="$TWO_NODE_SLURM_DIR"
  mkdir -p "$dir/spool/$node"
  if ! on_node "$node" slurmd -f "$dir/slurm.conf" -N "$node" </dev/null \
       >>"$dir/log/slurmd-$node.out" 2>&1; then
    _two_node_err "slurmd on $node failed to start: $(tail -n 5 "$dir/log/slurmd-$node.out")"
    return 1
  fi
}

two_node_slurm_start() {
  if [ $# -ne 1 ] || [ -z "$1" ]; then _two_node_err "usage: two_node_slurm_start DIR"; return 1; fi
  if [ -n "${TWO_NODE_SLURM_DIR:-}" ]; then
    _two_node_err "already running under $TWO_NODE_SLURM_DIR (call two_node_slurm_stop first)"
    return 1
  fi
  local why
  if why=$(two_node_slurm_unsupported); then _two_node_err "$why"; return 1; fi
  mkdir -p "$1" || return 1
  local dir
  dir=$(cd "$1" && pwd) || return 1
  if [ ${#dir} -gt 60 ]; then
    _two_node_err "DIR '$dir' is too long for UNIX socket paths (max 60 characters; use mktemp -d)"
    return 1
  fi
  chmod 755 "$dir"
  mkdir -p "$dir/munge" "$dir/log" "$dir/run" "$dir/state" "$dir/spool" "$dir/tmp" \
    "$dir/local/n1" "$dir/local/n2" || return 1
  chmod 755 "$dir/munge"
  TWO_NODE_SLURM_DIR="$dir"
  TWO_NODE_SLURM_ID=$$
  TWO_NODE_SLURM_SAVED_CONF="${SLURM_CONF-__unset__}"
  local var
  for var in $(compgen -e SLURM_); do unset "$var"; done
  export TWO_NODE_SLURM_DIR TWO_NODE_SLURM_ID
  export SLURM_CONF="$dir/slurm.conf"

  if ! _two_node_make_network; then
    _two_node_err "could not make the namespaces and their network"
    two_node_slurm_stop
    return 1
  fi
  if ! _two_node_write_conf || ! _local_slurm_munge_start "$dir/munge"; then
    two_node_slurm_stop
    return 1
  fi
  if ! on_node n1 slurmctld -c -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmctld.out" 2>&1; then
    _two_node_err "slurmctld failed to start: $(tail -n 5 "$dir/log/slurmctld.out")"
    two_node_slurm_log_tails 20
    two_node_slurm_stop
    return 1
  fi
  if ! _two_node_start_slurmd n1 || ! _two_node_start_slurmd n2 ||
     ! _two_node_wait_idle "${LOCAL_SLURM_TIMEOUT:-30}" n1 n2; then
    _two_node_err "the two nodes did not come up idle"
    two_node_slurm_log_tails 20
    two_node_slurm_stop
    return 1
  fi
  return 0
}

two_node_slurm_kill_node() {
  local node="$1" pids
  pids=$(_two_node_pids "$node")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  # shellcheck disable=SC2086
  [ -z "$pids" ] || _local_slurm_wait_gone 10 $pids
}

two_node_slurm_start_node() {
  local node="$1"
  rm -f "$TWO_NODE_SLURM_DIR/run/slurmd-$node.pid"
  _two_node_start_slurmd "$node" || return 1
  _two_node_wait_idle "${LOCAL_SLURM_TIMEOUT:-30}" "$node"
}

two_node_slurm_stop() {
  [ -n "${TWO_NODE_SLURM_DIR:-}" ] || return 0
  local dir="$TWO_NODE_SLURM_DIR" ctld node pids ns
  ctld=$(_local_slurm_pid "$dir/run/slurmctld.pid")
  if [ -n "$ctld" ] && _local_slurm_alive "$ctld"; then
    _local_slurm_cancel_and_shutdown on_head
    _local_slurm_wait_gone 20 "$ctld" || true
  fi
  # Whatever is left in the nodes (a slurmd without its controller, a hung step, a task): by PID.
  for node in n1 n2 sw; do
    pids=$(_two_node_pids "$node")
    # shellcheck disable=SC2086
    [ -z "$pids" ] || { kill -KILL $pids 2>/dev/null; _local_slurm_wait_gone 10 $pids; }
  done
  _local_slurm_munge_stop "$dir/munge"
  for node in n1 n2 sw; do
    ns=$(_two_node_ns "$node")
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ "${TWO_NODE_SLURM_SAVED_CONF:-__unset__}" = "__unset__" ]; then
    unset SLURM_CONF
  else
    export SLURM_CONF="$TWO_NODE_SLURM_SAVED_CONF"
  fi
  unset TWO_NODE_SLURM_DIR TWO_NODE_SLURM_SAVED_CONF
  return 0
}
