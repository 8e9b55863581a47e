# shellcheck shell=bash
# The common start of the tests that run a private Slurm (tests/slurm/test_*.sh): source it after
# setting `here` (this folder). It sources local_slurm.sh, makes the short temporary directory
# $tmp (the private Slurm's UNIX sockets live under it; 0755 because munged wants every directory
# above its socket searchable by all), stops the cluster and removes $tmp on exit, and defines
#   check NAME CONDITION-COMMAND...   counts a pass, or prints FAIL: NAME and the condition's output
#   report                             prints "P passed, F failed"; true when nothing failed
# shellcheck source=tests/slurm/local_slurm.sh
source "$here/local_slurm.sh"
tmp=$(mktemp -d)
chmod 755 "$tmp"
trap 'local_slurm_stop; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
failures=0
passes=0
check() {
  local name="$1"; shift
  if "$@" >"$tmp/check.out" 2>&1; then
    passes=$((passes + 1))
  else
    echo "FAIL: $name"
    sed 's/^/  /' "$tmp/check.out"
    failures=$((failures + 1))
    return 1
  fi
}
report() {
  echo "$passes passed, $failures failed"
  test "$failures" -eq 0
}
