#!/usr/bin/env bash
# slurm/probe.sbatch on a private single-node Slurm (tests/slurm/local_slurm.sh): the job exits 0
# and gathers probe-<host>.{toml,json,txt} into MOEPEAK_PROBE_DIR. Needs root (SKIP, exit 77).
# Run: ctest -R test_probe_sbatch   (or, as root: bash tests/slurm/test_probe_sbatch.sh build/moepeak .)
set -u
bin="$1"
src="$2"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: test_probe_sbatch needs root (its private Slurm runs slurmctld/slurmd as root)"
  exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/local_slurm.sh
source "$here/local_slurm.sh"
tmp=$(mktemp -d)
chmod 755 "$tmp"
trap 'local_slurm_stop; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
local_slurm_start "$tmp/slurm" || { echo "FAIL: the private Slurm did not start"; exit 1; }

host=$(hostname)
MOEPEAK="$bin" MOEPEAK_PROBE_DIR="$tmp/probe" MOEPEAK_PROBE_ARGS="--no-bench" MOEPEAK_RANKS_PER_NODE=2 \
  timeout -k 10 120 sbatch --wait --chdir "$tmp" -o "$tmp/job.out" --gpus-per-node=0 --cpus-per-task=1 "$src/slurm/probe.sbatch" >/dev/null 2>"$tmp/err"
rc=$?
failures=0
[ $rc -eq 0 ] || { echo "FAIL: sbatch --wait exited $rc"; cat "$tmp/err" "$tmp/job.out"; failures=1; }
for ext in toml json txt; do
  [ -s "$tmp/probe/probe-$host.$ext" ] || { echo "FAIL: no probe-$host.$ext"; failures=1; }
done
grep -q '^ranks_per_node = 2$' "$tmp/probe/probe-$host.toml" 2>/dev/null || { echo "FAIL: ranks_per_node"; failures=1; }
grep -qF 'probe file(s) in' "$tmp/job.out" || { echo "FAIL: the job's summary line"; failures=1; }
[ $failures -eq 0 ] && echo "test_probe_sbatch: passed"
exit $failures
